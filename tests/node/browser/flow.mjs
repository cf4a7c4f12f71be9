// Drives headless Chromium (the system's `chromium`, through puppeteer-core)
// through the product as a user does, on the page of page.js served from
// PAGE_URL against the API on API_URL; then the same calls from the allowed
// page are read, and from OTHER_URL (an origin not in CORS_ALLOWED_ORIGINS)
// are blocked by CORS (the API answers a no-cors probe: not unreachable). Prints one JSON
// report line; exits 1 on the first failed step.
//
// Environment: CHROMIUM, PAGE_URL, OTHER_URL, API_URL, LINK_URL (answers the
// confirmation link mailed to ?to=), EMAIL, PASSWORD, CHAT_TEXT (what the
// fake AI upstream streams).
import assert from 'node:assert/strict';
import puppeteer from 'puppeteer-core';

const env = process.env;
const report = { ok: false, steps: [] };
let step = '';
const begin = (name) => {
  step = name;
  report.steps.push(name);
};
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function confirmationLink() {
  const end = Date.now() + 30000;
  for (;;) {
    const r = await fetch(`${env.LINK_URL}?to=${encodeURIComponent(env.EMAIL)}`);
    if (r.status === 200) return r.text();
    if (Date.now() > end) throw new Error('no confirmation mail within 30 s');
    await sleep(200);
  }
}

const pageUrl = (origin) => `${origin}/index.html?api=${encodeURIComponent(env.API_URL)}`;

const root = typeof process.getuid === 'function' && process.getuid() === 0;
const browser = await puppeteer.launch({
  executablePath: env.CHROMIUM,
  headless: true,
  args: [...(root ? ['--no-sandbox'] : []), '--disable-gpu', '--disable-dev-shm-usage', '--no-first-run'],
});
const pageLog = [];
try {
  const page = await browser.newPage();
  page.on('console', (m) => pageLog.push(`[console.${m.type()}] ${m.text()}`));
  page.on('pageerror', (e) => pageLog.push(`[pageerror] ${e.message}`));
  page.on('requestfailed', (r) => pageLog.push(`[requestfailed] ${r.method()} ${r.url()} ${r.failure()?.errorText}`));
  const ready = async () => {
    await page.waitForFunction(() => window.app && document.getElementById('status').textContent !== 'loading', { timeout: 15000 });
  };
  const run = (fn, ...args) => page.evaluate(fn, ...args);

  begin('open the page');
  await page.goto(pageUrl(env.PAGE_URL), { waitUntil: 'load' });
  await ready();

  begin('sign up with auth-js');
  report.sign_up = await run((e, p) => window.app.signUp(e, p), env.EMAIL, env.PASSWORD);
  assert.equal(report.sign_up.session, false, 'a confirmation is required first');

  begin('open the confirmation link from the mail');
  const link = await confirmationLink();
  report.link_origin = new URL(link).origin;
  await page.goto(link, { waitUntil: 'load' });
  report.landed_on = new URL(page.url()).origin;
  await ready();

  begin('signed in on the page');
  report.session = await run(() => window.app.session());
  assert.ok(report.session, 'a session after the confirmation link');
  assert.equal(report.session.email, env.EMAIL);

  begin('GET /api/me: FREE');
  report.me_free = await run(() => window.app.me());
  assert.equal(report.me_free.status, 200, JSON.stringify(report.me_free));
  assert.equal(report.me_free.body.subscription.plan, 'FREE');
  assert.ok(report.me_free.request_id, 'x-request-id is exposed');

  begin('avatar through the signed upload URL, shown in <img>');
  report.avatar = await run(() => window.app.uploadAvatar());
  assert.equal(report.avatar.step, 'done', JSON.stringify(report.avatar));
  assert.equal(report.avatar.width, 16);

  begin('checkout with provider_a');
  report.checkout = await run(() => window.app.checkout('PRO'));
  assert.equal(report.checkout.status, 200, JSON.stringify(report.checkout));
  assert.equal(report.checkout.body.provider, 'provider_a');
  const orderId = report.checkout.body.orderId;

  begin('the return page polls the order to PAID');
  report.paid = await run((o) => window.app.waitPaid(o, 60000), orderId);
  assert.equal(report.paid.status, 200, JSON.stringify(report.paid));
  assert.equal(report.paid.body.status, 'PAID', JSON.stringify(report.paid));

  begin('GET /api/me: PRO');
  report.me_pro = await run(() => window.app.me());
  assert.equal(report.me_pro.body.subscription.plan, 'PRO', JSON.stringify(report.me_pro));

  begin('AI chat streamed through DefaultChatTransport');
  report.chat = await run((t) => window.app.chat(t), 'Hi');
  assert.equal(report.chat.text, env.CHAT_TEXT);
  assert.equal(report.chat.role, 'assistant');

  begin('sign out');
  report.sign_out = await run(() => window.app.signOut());
  assert.equal(report.sign_out.session, false);
  assert.equal(report.sign_out.me_status, 401);

  begin('the page shows it');
  report.dom = await page.evaluate(() => ({
    who: document.getElementById('who').textContent,
    plan: document.getElementById('plan').textContent,
    payment: document.getElementById('payment').textContent,
    chat: document.getElementById('chat').textContent,
    avatar: document.getElementById('avatar').naturalWidth,
  }));

  begin('the allowed origin reads the probe\'s calls');
  report.allowed_origin = await run((e, p) => window.app.probe(e, p), env.EMAIL, env.PASSWORD);
  assert.deepEqual(
    report.allowed_origin,
    { plans: 'status 200', health: 'status 200', sign_in: 'session true' },
    JSON.stringify(report.allowed_origin),
  );

  begin('the same page from an origin not allowed is blocked by CORS');
  const other = await browser.newPage();
  other.on('console', (m) => pageLog.push(`[other console.${m.type()}] ${m.text()}`));
  await other.goto(pageUrl(env.OTHER_URL), { waitUntil: 'load' });
  await other.waitForFunction(() => window.app, { timeout: 15000 });
  report.other_origin = await other.evaluate((e, p) => window.app.probe(e, p), env.EMAIL, env.PASSWORD);
  for (const k of ['plans', 'health', 'sign_in']) {
    const v = report.other_origin[k] ?? '';
    // Blocked, not unreachable: the API answered (the no-cors probe), the
    // browser withheld the answer from the page.
    assert.ok(v.startsWith('blocked by CORS'), `${k}: ${v}`);
  }

  report.ok = true;
} catch (e) {
  report.failed_step = step;
  report.error = String(e?.stack ?? e);
} finally {
  report.page_log = pageLog.slice(-40);
  await browser.close();
}
console.log(JSON.stringify(report));
process.exit(report.ok ? 0 : 1);
