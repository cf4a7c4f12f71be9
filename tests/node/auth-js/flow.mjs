// The real `@supabase/auth-js` GoTrueClient against our built-in identity
// provider (`/auth/v1`). Run by tests/tests/auth_js_client.rs, which starts the
// api + worker and an HTTP endpoint listing the mails the SMTP sink received.
//
//   node flow.mjs <scenario>
//   scenario: main | expired | email_change | oauth_unverified | contested | pkce_other_browser
//
// Environment: API_URL (base of the api, no trailing slash), MAILS_URL (GET →
// JSON array of {to: [..], subject, body}), APP_URL (the app's origin),
// RUN_ID (makes the email addresses unique); for oauth_unverified also
// GITHUB_URL (the fake GitHub the server is pointed at) and GITHUB_EMAIL (the
// primary address it reports, not verified).
//
// Prints one JSON report line on stdout and exits 0, or prints
// {"ok": false, "step": …, "error": …} and exits 1 at the first failed step.
import assert from 'node:assert/strict';
import { GoTrueClient } from '@supabase/auth-js';

const API_URL = must('API_URL');
const MAILS_URL = must('MAILS_URL');
const APP_URL = must('APP_URL');
const RUN_ID = process.env.RUN_ID || Math.random().toString(16).slice(2, 10);
const AUTH_URL = `${API_URL}/auth/v1`;
const scenario = process.argv[2] || 'main';

function must(name) {
  const v = process.env[name];
  if (!v) {
    console.log(JSON.stringify({ ok: false, step: 'env', error: `${name} is not set` }));
    process.exit(1);
  }
  return v;
}

// ---- plumbing -------------------------------------------------------------

let step = 'start';
const report = { ok: true, scenario, steps: [] };
const requests = []; // every request the clients made: {method, path, status, body}

function begin(name) {
  step = name;
  report.steps.push(name);
  process.stderr.write(`step: ${name}\n`);
}

/** `fetch` that records what the client sent and what it got (no secrets leave the process). */
async function loggingFetch(input, init = {}) {
  const url = new URL(typeof input === 'string' ? input : input.url);
  const entry = { method: init.method || 'GET', path: url.pathname, query: url.search, body: init.body };
  requests.push(entry);
  const res = await fetch(input, init);
  entry.status = res.status;
  return res;
}

/** A fresh in-memory storage (what a browser's localStorage would be). */
function memoryStorage() {
  const m = new Map();
  return {
    getItem: (k) => (m.has(k) ? m.get(k) : null),
    setItem: (k, v) => void m.set(k, v),
    removeItem: (k) => void m.delete(k),
  };
}

let clients = 0;
function newClient(opts = {}) {
  clients += 1;
  return new GoTrueClient({
    url: AUTH_URL,
    // What supabase-js sends; our provider must accept (and may ignore) it.
    headers: { apikey: 'public-anon-key', 'X-Client-Info': 'auth-js-test' },
    storageKey: `sb-test-${clients}`,
    storage: memoryStorage(),
    autoRefreshToken: false,
    persistSession: true,
    detectSessionInUrl: false,
    fetch: loggingFetch,
    ...opts,
  });
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function mails() {
  const r = await fetch(MAILS_URL);
  assert.equal(r.status, 200, 'mail listing endpoint');
  return r.json();
}

/** Waits for the `n`-th (1-based) mail to `to`; returns it. */
async function waitMail(to, n, timeoutMs = 30000) {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const mine = (await mails()).filter((m) => m.to.some((t) => t.toLowerCase() === to.toLowerCase()));
    if (mine.length >= n) return mine[n - 1];
    if (Date.now() > end) throw new Error(`no mail #${n} to ${to} within ${timeoutMs} ms (have ${mine.length})`);
    await sleep(200);
  }
}

async function mailCount(to) {
  return (await mails()).filter((m) => m.to.some((t) => t.toLowerCase() === to.toLowerCase())).length;
}

/** Every http(s) URL in a mail body (HTML entities and quoted-printable already decoded by the test). */
function urlsIn(body) {
  const out = [];
  for (const raw of body.match(/https?:\/\/[^\s"'<>)]+/g) || []) {
    const u = raw.replace(/&amp;/g, '&').replace(/[.,:;!?]+$/, '');
    try {
      out.push(new URL(u).href);
    } catch {
      // not a URL after all (e.g. prose around it)
    }
  }
  return out;
}

/** The token hash a mail carries: `token_hash=` of any link, else `token=` of a `/verify` link. */
function tokenHashOf(mail) {
  for (const u of urlsIn(mail.body)) {
    const url = new URL(u);
    if (url.searchParams.get('token_hash')) return url.searchParams.get('token_hash');
  }
  for (const u of urlsIn(mail.body)) {
    const url = new URL(u);
    if (url.pathname.endsWith('/verify') && url.searchParams.get('token')) return url.searchParams.get('token');
  }
  throw new Error(`no token hash in mail: ${mail.body}`);
}

/** The `/auth/v1/verify` link of a mail. */
function verifyLinkOf(mail) {
  const u = urlsIn(mail.body).find((x) => new URL(x).pathname.endsWith('/auth/v1/verify'));
  if (!u) throw new Error(`no /auth/v1/verify link in mail: ${mail.body}`);
  return u;
}

/** Asserts `error` is the platform's API error `code` with HTTP `status`. */
function expectApiError(error, code, status, what) {
  assert.ok(error, `${what}: expected error ${code}, got success`);
  assert.equal(error.code, code, `${what}: error.code (${JSON.stringify(error)})`);
  assert.equal(error.status, status, `${what}: error.status (${JSON.stringify(error)})`);
}

function expectSession(data, error, what) {
  assert.equal(error, null, `${what}: ${JSON.stringify(error)}`);
  const s = data.session;
  assert.ok(s, `${what}: no session`);
  assert.equal(typeof s.access_token, 'string', `${what}: access_token`);
  assert.equal(s.access_token.split('.').length, 3, `${what}: access_token is a JWT`);
  assert.equal(typeof s.refresh_token, 'string', `${what}: refresh_token`);
  assert.ok(s.refresh_token.length >= 8, `${what}: refresh_token`);
  assert.equal(s.token_type, 'bearer', `${what}: token_type`);
  assert.ok(Number.isInteger(s.expires_in) && s.expires_in > 90, `${what}: expires_in ${s.expires_in}`);
  const now = Math.floor(Date.now() / 1000);
  assert.ok(Math.abs(s.expires_at - (now + s.expires_in)) <= 5, `${what}: expires_at ${s.expires_at}`);
  assert.ok(s.user && typeof s.user.id === 'string', `${what}: session.user`);
  assert.ok(data.user && data.user.id === s.user.id, `${what}: data.user`);
  return s;
}

/** The `/auth/v1/verify` link of a mail, as a browser would request it: the link names the public
 *  origin (`API_EXTERNAL_URL`, the app's); the test's api listens on a random port. */
function onApi(link) {
  const u = new URL(link);
  return `${API_URL}${u.pathname}${u.search}`;
}

/**
 * Follows redirects as a browser does, from `href` until a page of the app (APP_URL, outside
 * `/auth/v1/`) or an answer that is not a redirect. Requests to the app's `/auth/v1/…` go to our
 * api (the app serves or proxies it on its origin; the test's api listens on a random port).
 * Returns the URL the browser ends on and every hop.
 */
async function browse(href, maxHops = 8) {
  const app = new URL(APP_URL);
  const hops = [];
  let url = new URL(href).href;
  for (let i = 0; i < maxHops; i += 1) {
    const u = new URL(url);
    if (u.origin === app.origin && !u.pathname.startsWith('/auth/v1/')) return { url, hops };
    const target = u.origin === app.origin ? onApi(url) : url;
    const r = await fetch(target, { redirect: 'manual' });
    const location = r.headers.get('location');
    hops.push({ url, status: r.status, location });
    if (r.status < 300 || r.status > 399 || !location) {
      throw new Error(`browsing ${href} stopped at ${url}: ${r.status} ${await r.text()}`);
    }
    url = new URL(location, url).href;
  }
  throw new Error(`more than ${maxHops} redirects from ${href}: ${JSON.stringify(hops)}`);
}

/** The parameters of a URL's fragment and query, as auth-js reads a callback URL. */
function urlParams(href) {
  const u = new URL(href);
  const out = Object.fromEntries(new URLSearchParams(u.hash.replace(/^#/, '')));
  for (const [k, v] of u.searchParams) out[k] = v;
  return out;
}

/**
 * A browser tab that lands on `href` (the app's callback page) with a fresh client on it: the
 * client's `detectSessionInUrl` reads the URL while it initializes, exactly as in a browser
 * (auth-js does that only when `window` and `document` exist, so the tab provides just those for
 * the time of `initialize()`). Returns the client and what `initialize()` reported.
 */
async function landOn(href, opts = {}) {
  const saved = {
    window: Object.getOwnPropertyDescriptor(globalThis, 'window'),
    document: Object.getOwnPropertyDescriptor(globalThis, 'document'),
    BroadcastChannel: Object.getOwnPropertyDescriptor(globalThis, 'BroadcastChannel'),
  };
  let current = new URL(href);
  globalThis.window = {
    location: {
      get href() { return current.href; },
      get hash() { return current.hash; },
      set hash(h) { current.hash = h; },
      assign(u) { throw new Error(`the page navigated to ${u}`); },
    },
    history: { state: null, replaceState(_s, _t, u) { current = new URL(u, current); } },
  };
  globalThis.document = { visibilityState: 'visible' };
  // One tab: no cross-tab channel (it would keep Node alive).
  globalThis.BroadcastChannel = undefined;
  try {
    const client = newClient({ detectSessionInUrl: true, ...opts });
    const { error } = await client.initialize();
    return { client, error, url: current.href };
  } finally {
    for (const [k, d] of Object.entries(saved)) {
      if (d) Object.defineProperty(globalThis, k, d);
      else delete globalThis[k];
    }
  }
}

/** Waits for the first mail to `to` whose subject is `subject`, among those after the first `skip`. */
async function waitMailWithSubject(to, subject, skip = 0, timeoutMs = 30000) {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const mine = (await mails()).filter((m) => m.to.some((t) => t.toLowerCase() === to.toLowerCase()));
    const found = mine.slice(skip).find((m) => m.subject === subject);
    if (found) return found;
    if (Date.now() > end) {
      throw new Error(`no mail "${subject}" to ${to} within ${timeoutMs} ms: ${JSON.stringify(mine.map((m) => m.subject))}`);
    }
    await sleep(200);
  }
}

/** The requests the clients made since index `from`, as `METHOD path?query`. */
function requestsSince(from) {
  return requests.slice(from).map((r) => `${r.method} ${r.path}${r.query}`);
}

function decodeJwt(t) {
  const [h, p] = t.split('.');
  return {
    header: JSON.parse(Buffer.from(h, 'base64url').toString()),
    payload: JSON.parse(Buffer.from(p, 'base64url').toString()),
  };
}

// ---- scenarios ------------------------------------------------------------

const PASSWORD = 'Correct-Horse-9';
const PASSWORD2 = 'Battery-Staple-7';
const PASSWORD3 = 'Another-Secret-5';

async function main() {
  const email = `ann.${RUN_ID}@example.org`;
  const c = newClient();

  begin('signUp');
  let { data, error } = await c.signUp({
    email,
    password: PASSWORD,
    options: { emailRedirectTo: `${APP_URL}/welcome`, data: { full_name: 'Ann Lee' } },
  });
  assert.equal(error, null, `signUp: ${JSON.stringify(error)}`);
  assert.equal(data.session, null, 'signUp must not sign in before the email is confirmed');
  assert.ok(data.user && typeof data.user.id === 'string', 'signUp returns the user');
  assert.equal(data.user.email, email);
  const userId = data.user.id;
  report.user_id = userId;
  report.email = email;

  begin('signInWithPassword before confirming → email_not_confirmed');
  ({ data, error } = await c.signInWithPassword({ email, password: PASSWORD }));
  expectApiError(error, 'email_not_confirmed', 400, 'unconfirmed sign-in');
  assert.equal(data.session, null);

  begin('signUp with a weak password → weak_password');
  ({ data, error } = await c.signUp({ email: `weak.${RUN_ID}@example.org`, password: 'short' }));
  expectApiError(error, 'weak_password', 422, 'weak sign-up');
  assert.equal(error.name, 'AuthWeakPasswordError');
  assert.ok(Array.isArray(error.reasons) && error.reasons.includes('length'), `reasons ${JSON.stringify(error.reasons)}`);

  begin('confirmation mail');
  const confirmation = await waitMail(email, 1);
  const confirmHash = tokenHashOf(confirmation);
  report.confirmation_subject = confirmation.subject;

  begin('verifyOtp({token_hash, type: "email"}) → session');
  ({ data, error } = await c.verifyOtp({ token_hash: confirmHash, type: 'email' }));
  let s = expectSession(data, error, 'verifyOtp');
  assert.equal(s.user.id, userId);
  assert.equal(s.user.email, email);
  assert.ok(s.user.email_confirmed_at, 'email_confirmed_at set after confirmation');
  assert.equal((await c.getSession()).data.session.access_token, s.access_token, 'client stored the session');

  begin('verifyOtp with the same token_hash again → otp_expired');
  ({ data, error } = await c.verifyOtp({ token_hash: confirmHash, type: 'email' }));
  expectApiError(error, 'otp_expired', 403, 'reused OTP');

  begin('signInWithPassword with a wrong password → invalid_credentials');
  ({ data, error } = await c.signInWithPassword({ email, password: 'Wrong-Password-1' }));
  expectApiError(error, 'invalid_credentials', 400, 'wrong password');
  ({ data, error } = await c.signInWithPassword({ email: `nobody.${RUN_ID}@example.org`, password: PASSWORD }));
  expectApiError(error, 'invalid_credentials', 400, 'unknown email');

  begin('signInWithPassword');
  ({ data, error } = await c.signInWithPassword({ email, password: PASSWORD }));
  s = expectSession(data, error, 'password sign-in');
  assert.equal(s.user.id, userId);
  assert.equal(s.user.user_metadata.full_name, 'Ann Lee', 'sign-up data lands in user_metadata');

  begin('getUser');
  ({ data, error } = await c.getUser());
  assert.equal(error, null, `getUser: ${JSON.stringify(error)}`);
  assert.equal(data.user.id, userId);
  assert.equal(data.user.email, email);
  assert.equal(data.user.aud, 'authenticated');

  begin('getClaims verified through our JWKS');
  const before = requests.length;
  ({ data, error } = await c.getClaims());
  assert.equal(error, null, `getClaims: ${JSON.stringify(error)}`);
  const claimReqs = requests.slice(before).map((r) => `${r.method} ${r.path}`);
  assert.deepEqual(claimReqs, ['GET /auth/v1/.well-known/jwks.json'],
    'getClaims fetched the JWKS and did not fall back to GET /user');
  assert.equal(data.header.alg, 'ES256');
  assert.ok(data.header.kid, 'kid in the JWT header');
  const claims = data.claims;
  assert.equal(claims.sub, userId);
  assert.equal(claims.email, email);
  assert.equal(claims.role, 'authenticated');
  assert.equal(claims.aud, 'authenticated');
  assert.equal(typeof claims.session_id, 'string');
  assert.equal(claims.aal, 'aal1');
  assert.equal(claims.is_anonymous, false);
  assert.ok(Array.isArray(claims.amr) && claims.amr.length > 0, 'amr');
  assert.ok(claims.exp > Math.floor(Date.now() / 1000));
  report.jwt_header = data.header;
  report.claims = claims;
  // A token whose signature does not match: the client must reject it (so it really verified).
  const parts = s.access_token.split('.');
  const forged = decodeJwt(s.access_token).payload;
  forged.role = 'service_role';
  const tampered = `${parts[0]}.${Buffer.from(JSON.stringify(forged)).toString('base64url')}.${parts[2]}`;
  ({ data, error } = await c.getClaims(tampered));
  assert.ok(error, 'a tampered token must not verify');
  assert.equal(error.code, 'invalid_jwt', JSON.stringify(error));

  begin('refreshSession rotates the refresh token');
  const r1 = s.refresh_token;
  ({ data, error } = await c.refreshSession());
  const s2 = expectSession(data, error, 'refresh');
  assert.notEqual(s2.refresh_token, r1, 'refresh token rotated');
  assert.equal(s2.user.id, userId);

  begin('the revoked parent of the active token returns the active one');
  ({ data, error } = await c.refreshSession({ refresh_token: r1 }));
  const s2b = expectSession(data, error, 'parent reuse');
  assert.equal(s2b.refresh_token, s2.refresh_token, 'the active refresh token is returned');

  begin('refreshSession again');
  ({ data, error } = await c.refreshSession());
  const s3 = expectSession(data, error, 'second refresh');
  assert.notEqual(s3.refresh_token, s2.refresh_token);

  begin('reuse of an old refresh token → refresh_token_already_used, session revoked');
  ({ data, error } = await c.refreshSession({ refresh_token: r1 }));
  expectApiError(error, 'refresh_token_already_used', 400, 'old refresh token reuse');
  ({ data, error } = await c.refreshSession({ refresh_token: s3.refresh_token }));
  assert.ok(error, 'the active refresh token of a revoked session must not refresh');
  assert.equal(error.name === 'AuthApiError' || error.name === 'AuthSessionMissingError', true, JSON.stringify(error));
  report.after_revocation_refresh_error = { name: error.name, code: error.code ?? null, status: error.status };
  ({ data, error } = await c.getUser(s3.access_token));
  assert.ok(error, 'GET /user with a revoked session must fail');
  assert.equal(error.name, 'AuthSessionMissingError', `session_not_found expected: ${JSON.stringify(error)}`);

  begin('updateUser({password})');
  ({ data, error } = await c.signInWithPassword({ email, password: PASSWORD }));
  s = expectSession(data, error, 'sign-in for updateUser');
  ({ data, error } = await c.updateUser({ password: PASSWORD2 }));
  assert.equal(error, null, `updateUser: ${JSON.stringify(error)}`);
  assert.equal(data.user.id, userId);
  ({ data, error } = await c.updateUser({ password: PASSWORD2 }));
  expectApiError(error, 'same_password', 422, 'same password');
  ({ data, error } = await c.updateUser({ password: 'short' }));
  expectApiError(error, 'weak_password', 422, 'weak new password');
  ({ data, error } = await newClient().signInWithPassword({ email, password: PASSWORD }));
  expectApiError(error, 'invalid_credentials', 400, 'old password after change');
  ({ data, error } = await newClient().signInWithPassword({ email, password: PASSWORD2 }));
  expectSession(data, error, 'new password');

  begin('signOut() (global)');
  ({ data, error } = await c.signInWithPassword({ email, password: PASSWORD2 }));
  s = expectSession(data, error, 'sign-in for signOut');
  ({ error } = await c.signOut());
  assert.equal(error, null, `signOut: ${JSON.stringify(error)}`);
  assert.equal((await c.getSession()).data.session, null, 'signOut clears the client');
  ({ data, error } = await c.getUser(s.access_token));
  assert.equal(error?.name, 'AuthSessionMissingError', `GET /user after signOut: ${JSON.stringify(error)}`);
  ({ data, error } = await c.refreshSession({ refresh_token: s.refresh_token }));
  assert.ok(error, 'the refresh token of a signed-out session must not refresh');

  begin('signOut scopes: others, then local');
  const a = newClient();
  const b = newClient();
  ({ data, error } = await a.signInWithPassword({ email, password: PASSWORD2 }));
  const sa = expectSession(data, error, 'client A');
  ({ data, error } = await b.signInWithPassword({ email, password: PASSWORD2 }));
  const sb = expectSession(data, error, 'client B');
  ({ error } = await a.signOut({ scope: 'others' }));
  assert.equal(error, null, `signOut others: ${JSON.stringify(error)}`);
  ({ data, error } = await b.getUser(sb.access_token));
  assert.equal(error?.name, 'AuthSessionMissingError', `B signed out by "others": ${JSON.stringify(error)}`);
  ({ data, error } = await a.getUser());
  assert.equal(error, null, `A survives "others": ${JSON.stringify(error)}`);
  ({ error } = await a.signOut({ scope: 'local' }));
  assert.equal(error, null, `signOut local: ${JSON.stringify(error)}`);
  assert.equal((await a.getSession()).data.session, null, 'local sign-out clears the client');
  ({ data, error } = await a.getUser(sa.access_token));
  assert.equal(error?.name, 'AuthSessionMissingError', `A's session ended: ${JSON.stringify(error)}`);

  begin('PKCE signInWithOtp → mail → /verify → ?code= → exchangeCodeForSession');
  const pk = newClient({ flowType: 'pkce' });
  const before3 = await mailCount(email);
  const otpStart = requests.length;
  ({ data, error } = await pk.signInWithOtp({
    email,
    options: { emailRedirectTo: `${APP_URL}/auth/callback`, shouldCreateUser: false },
  }));
  assert.equal(error, null, `signInWithOtp: ${JSON.stringify(error)}`);
  const otpBody = JSON.parse(requests.slice(otpStart).find((r) => r.path === '/auth/v1/otp').body);
  assert.equal(otpBody.code_challenge_method, 's256');
  const magic = await waitMail(email, before3 + 1);
  const link = verifyLinkOf(magic);
  report.magic_link_path = new URL(link).pathname;
  // Follow the link on our api (the test binds to a random port; the path and query are what matter).
  const lu = new URL(link);
  const vr = await fetch(`${API_URL}${lu.pathname}${lu.search}`, { redirect: 'manual' });
  const loc = vr.headers.get('location');
  assert.equal(vr.status, 303, `GET /verify status (location ${loc})`);
  const back = new URL(loc);
  assert.equal(`${back.origin}${back.pathname}`, `${APP_URL}/auth/callback`, `redirect target ${loc}`);
  const code = back.searchParams.get('code');
  assert.ok(code, `?code= in ${loc}`);
  const exStart = requests.length;
  ({ data, error } = await pk.exchangeCodeForSession(code));
  const ps = expectSession(data, error, 'exchangeCodeForSession');
  assert.equal(ps.user.id, userId);
  report.access_token = ps.access_token;
  const exBody = JSON.parse(requests.slice(exStart).find((r) => r.query === '?grant_type=pkce').body);

  begin('the same auth code again → flow_state_not_found');
  const again = await fetch(`${AUTH_URL}/token?grant_type=pkce`, {
    method: 'POST',
    headers: { 'content-type': 'application/json;charset=UTF-8', 'x-supabase-api-version': '2024-01-01' },
    body: JSON.stringify(exBody),
  });
  const againBody = await again.json();
  assert.equal(againBody.code, 'flow_state_not_found', JSON.stringify(againBody));
  assert.equal(again.status, 404);

  begin('resetPasswordForEmail → mail');
  const before2 = await mailCount(email);
  ({ data, error } = await c.resetPasswordForEmail(email, { redirectTo: `${APP_URL}/account/update-password` }));
  assert.equal(error, null, `resetPasswordForEmail: ${JSON.stringify(error)}`);
  assert.deepEqual(data, {});
  const recovery = await waitMail(email, before2 + 1);
  const recoveryHash = tokenHashOf(recovery);
  report.recovery_subject = recovery.subject;

  begin('/auth/confirm with the recovery token_hash → 303 + session cookie');
  const confirmUrl = `${API_URL}/auth/confirm?token_hash=${encodeURIComponent(recoveryHash)}&type=recovery&next=${encodeURIComponent('/account/update-password')}`;
  const cr = await fetch(confirmUrl, { redirect: 'manual' });
  const cookies = cr.headers.getSetCookie();
  report.confirm = { status: cr.status, location: cr.headers.get('location'), set_cookie: cookies };
  assert.equal(cr.status, 303, `/auth/confirm status (location ${cr.headers.get('location')})`);
  assert.equal(new URL(cr.headers.get('location'), APP_URL).href, `${APP_URL}/account/update-password`);
  const cookie = (name) => {
    const line = cookies.find((l) => l.startsWith(`${name}=`));
    assert.ok(line, `${name} cookie set: ${JSON.stringify(cookies)}`);
    return { line, value: line.slice(name.length + 1).split(';')[0] };
  };
  const access = cookie('sb-access-token');
  assert.match(access.line, /;\s*HttpOnly/i);
  assert.match(access.line, /;\s*SameSite=Lax/i);
  assert.equal(decodeJwt(access.value).payload.sub, userId, 'the cookie carries the user\'s token');
  const refresh = cookie('sb-refresh-token');
  report.cookie_access_token = access.value;

  begin('the recovery session sets a new password');
  const rc = newClient();
  ({ data, error } = await rc.setSession({ access_token: access.value, refresh_token: refresh.value }));
  assert.equal(error, null, `setSession: ${JSON.stringify(error)}`);
  ({ data, error } = await rc.updateUser({ password: PASSWORD3 }));
  assert.equal(error, null, `updateUser after recovery: ${JSON.stringify(error)}`);
  ({ data, error } = await newClient().signInWithPassword({ email, password: PASSWORD3 }));
  expectSession(data, error, 'sign-in with the reset password');
}

async function expired() {
  const email = `late.${RUN_ID}@example.org`;
  const c = newClient();
  begin('signUp');
  let { data, error } = await c.signUp({ email, password: PASSWORD });
  assert.equal(error, null, `signUp: ${JSON.stringify(error)}`);
  begin('confirmation mail, then wait past the OTP expiry');
  const hash = tokenHashOf(await waitMail(email, 1));
  await sleep(Number(process.env.WAIT_MS || 2500));
  begin('verifyOtp with an expired token_hash → otp_expired');
  ({ data, error } = await c.verifyOtp({ token_hash: hash, type: 'email' }));
  expectApiError(error, 'otp_expired', 403, 'expired OTP');
  assert.equal(data.session, null);
  begin('still unconfirmed');
  ({ data, error } = await c.signInWithPassword({ email, password: PASSWORD }));
  expectApiError(error, 'email_not_confirmed', 400, 'sign-in after an expired confirmation');
}

/**
 * The secure email change (the platform's "double confirm changes"): `updateUser({email})` mails the
 * current and the new address; the change applies only once both links were followed. Order used
 * here: the link mailed to the CURRENT address first (it answers a message, no session, nothing
 * moves), then the one mailed to the NEW address (it moves the account and signs in).
 */
async function emailChange() {
  const oldEmail = `eve.${RUN_ID}@example.org`;
  const newEmail = `eve.new.${RUN_ID}@example.org`;
  const c = newClient();

  begin('signUp and confirm the current address');
  let { data, error } = await c.signUp({ email: oldEmail, password: PASSWORD });
  assert.equal(error, null, `signUp: ${JSON.stringify(error)}`);
  const userId = data.user.id;
  ({ data, error } = await c.verifyOtp({ token_hash: tokenHashOf(await waitMail(oldEmail, 1)), type: 'email' }));
  const s = expectSession(data, error, 'confirmation');
  assert.equal(s.user.email, oldEmail);

  begin('updateUser({email}) answers the user, the address not moved yet');
  const target = `${APP_URL}/account/email`;
  ({ data, error } = await c.updateUser({ email: newEmail }, { emailRedirectTo: target }));
  assert.equal(error, null, `updateUser({email}): ${JSON.stringify(error)}`);
  assert.equal(data.user.id, userId);
  assert.equal(data.user.email, oldEmail, 'the address moves only once both halves are confirmed');
  assert.equal(data.user.new_email, newEmail, 'new_email shows the pending change');
  assert.ok(data.user.email_change_sent_at, 'email_change_sent_at');
  ({ data, error } = await c.getUser());
  assert.equal(error, null, `getUser: ${JSON.stringify(error)}`);
  assert.equal(data.user.email, oldEmail);
  ({ data, error } = await newClient().signInWithPassword({ email: newEmail, password: PASSWORD }));
  expectApiError(error, 'invalid_credentials', 400, 'sign-in with the new address before the change');

  begin('the two mails: one to the current address, one to the new');
  const toCurrent = await waitMail(oldEmail, 2);
  const toNew = await waitMail(newEmail, 1);
  assert.equal(toCurrent.subject, toNew.subject, 'both halves are the email change mail');
  assert.ok(toCurrent.body.includes(newEmail) && toNew.body.includes(oldEmail), 'both mails name both addresses');
  const currentLink = verifyLinkOf(toCurrent);
  const newLink = verifyLinkOf(toNew);
  assert.equal(new URL(currentLink).searchParams.get('type'), 'email_change');
  assert.notEqual(tokenHashOf(toCurrent), tokenHashOf(toNew), 'one token per half');

  begin('the link mailed to the current address: a message, no session, nothing moves');
  let r = await fetch(onApi(currentLink), { redirect: 'manual' });
  let loc = r.headers.get('location');
  assert.equal(r.status, 303, `GET /verify (current address): ${r.status} ${loc}`);
  assert.ok(loc.startsWith(`${target}#`), `back to redirect_to: ${loc}`);
  let p = urlParams(loc);
  assert.equal(p.message, 'Confirmation link accepted. Please proceed to confirm link sent to the other email', loc);
  assert.equal(p.access_token, undefined, `no session from the first half: ${loc}`);
  assert.equal(p.error_code, undefined, loc);
  report.first_half_location = loc;
  ({ data, error } = await c.getUser());
  assert.equal(error, null, `getUser after the first half: ${JSON.stringify(error)}`);
  assert.equal(data.user.email, oldEmail, 'still the current address after one half');
  ({ data, error } = await newClient().signInWithPassword({ email: newEmail, password: PASSWORD }));
  expectApiError(error, 'invalid_credentials', 400, 'sign-in with the new address after one half');

  begin('the link mailed to the new address: the account moves, the browser is signed in');
  r = await fetch(onApi(newLink), { redirect: 'manual' });
  loc = r.headers.get('location');
  assert.equal(r.status, 303, `GET /verify (new address): ${r.status} ${loc}`);
  assert.ok(loc.startsWith(`${target}#`), `back to redirect_to: ${loc}`);
  p = urlParams(loc);
  assert.equal(p.type, 'email_change', loc);
  const tab = await landOn(loc);
  assert.equal(tab.error, null, `the client read the session from the URL: ${JSON.stringify(tab.error)}`);
  const landed = (await tab.client.getSession()).data.session;
  assert.ok(landed, 'the tab has a session');
  assert.equal(landed.user.id, userId);
  assert.equal(landed.user.email, newEmail);
  assert.equal(tab.url.includes('access_token'), false, 'the client cleared the tokens from the URL');

  begin('getUser() shows the new address (the session from before the change goes on)');
  ({ data, error } = await c.getUser());
  assert.equal(error, null, `getUser: ${JSON.stringify(error)}`);
  assert.equal(data.user.id, userId);
  assert.equal(data.user.email, newEmail);
  assert.equal(data.user.new_email, undefined, `no pending change left: ${data.user.new_email}`);

  begin('password sign-in: the new address works, the old one is refused');
  ({ data, error } = await newClient().signInWithPassword({ email: newEmail, password: PASSWORD }));
  const moved = expectSession(data, error, 'sign-in with the new address');
  assert.equal(moved.user.id, userId);
  assert.equal(moved.user.email, newEmail);
  ({ data, error } = await newClient().signInWithPassword({ email: oldEmail, password: PASSWORD }));
  expectApiError(error, 'invalid_credentials', 400, 'sign-in with the old address');
  assert.equal(data.session, null);
}

/**
 * An OAuth sign-in whose provider did not verify the address (GoTrue's `external.go`): the browser
 * comes back with `provider_email_needs_verification` and no session, a confirmation mail is issued
 * for that sign-in, and following its link signs in (keeping the GitHub identity, so the next
 * GitHub sign-in has a session too).
 */
async function oauthUnverified() {
  const GITHUB_URL = must('GITHUB_URL');
  const email = must('GITHUB_EMAIL');
  const callback = `${APP_URL}/auth/callback`;
  const c = newClient();

  begin('signInWithOAuth({provider: "github"}) gives the authorize URL');
  let { data, error } = await c.signInWithOAuth({ provider: 'github', options: { redirectTo: callback } });
  assert.equal(error, null, `signInWithOAuth: ${JSON.stringify(error)}`);
  assert.equal(data.provider, 'github');
  const start = new URL(data.url);
  assert.equal(`${start.origin}${start.pathname}`, `${AUTH_URL}/authorize`, data.url);
  assert.equal(start.searchParams.get('provider'), 'github');
  assert.equal(start.searchParams.get('redirect_to'), callback);

  begin('the browser goes through /authorize and GitHub and back to the app');
  const before = await mailCount(email);
  let trip = await browse(data.url);
  report.unverified_trip = trip.hops;
  assert.equal(trip.hops[0].status, 302, JSON.stringify(trip.hops));
  assert.ok(trip.hops[0].location.startsWith(`${GITHUB_URL}/login/oauth/authorize?`), 'to GitHub');
  assert.ok(trip.hops.some((h) => new URL(h.url).pathname === '/auth/v1/callback'), 'GitHub sent it to our callback');
  assert.ok(trip.url.startsWith(callback), `ends on the app's callback page: ${trip.url}`);
  const p = urlParams(trip.url);
  assert.equal(p.access_token, undefined, `no session for an unverified address: ${trip.url}`);
  assert.equal(p.code, undefined, `no code for an unverified address: ${trip.url}`);
  assert.equal(p.error_code, 'provider_email_needs_verification', trip.url);
  assert.equal(p.error, 'access_denied', `GoTrue's error for it: ${trip.url}`);

  begin('the callback page: the client reports the error and has no session');
  let tab = await landOn(trip.url);
  assert.ok(tab.error, 'initialize() reports the error in the URL');
  assert.equal(tab.error.name, 'AuthImplicitGrantRedirectError', JSON.stringify(tab.error));
  assert.equal(tab.error.details?.code, 'provider_email_needs_verification', JSON.stringify(tab.error));
  assert.equal(tab.error.details?.error, 'access_denied', JSON.stringify(tab.error));
  assert.match(tab.error.message, /confirmation email has been sent/i);
  report.needs_verification_error = { message: tab.error.message, details: tab.error.details };
  assert.equal((await tab.client.getSession()).data.session, null, 'no session');
  ({ data, error } = await tab.client.getUser());
  assert.equal(error?.name, 'AuthSessionMissingError', `getUser without a session: ${JSON.stringify(error)}`);

  begin('the confirmation mail issued for that sign-in');
  const confirmation = await waitMail(email, before + 1);
  const link = verifyLinkOf(confirmation);
  assert.equal(new URL(link).searchParams.get('redirect_to'), callback, `the mail leads back to the sign-in's redirect: ${link}`);

  begin('following it signs the browser in');
  trip = await browse(link);
  assert.equal(trip.hops[0].status, 303, JSON.stringify(trip.hops));
  assert.ok(trip.url.startsWith(`${callback}#`), trip.url);
  tab = await landOn(trip.url);
  assert.equal(tab.error, null, `initialize(): ${JSON.stringify(tab.error)}`);
  const s = (await tab.client.getSession()).data.session;
  assert.ok(s && s.access_token, 'a session after the confirmation');
  assert.equal(s.user.email, email);
  assert.ok(s.user.email_confirmed_at, 'email_confirmed_at');
  const userId = s.user.id;
  ({ data, error } = await tab.client.getUser());
  assert.equal(error, null, `getUser: ${JSON.stringify(error)}`);
  assert.equal(data.user.id, userId);
  const providers = (data.user.identities || []).map((i) => i.provider);
  assert.ok(providers.includes('github'), `the GitHub identity was kept: ${JSON.stringify(providers)}`);
  ({ data, error } = await tab.client.refreshSession());
  expectSession(data, error, 'refresh of the confirmed session');

  begin('the next GitHub sign-in has a session in the same account');
  ({ data, error } = await c.signInWithOAuth({ provider: 'github', options: { redirectTo: callback } }));
  assert.equal(error, null, `signInWithOAuth: ${JSON.stringify(error)}`);
  trip = await browse(data.url);
  assert.equal(urlParams(trip.url).error_code, undefined, trip.url);
  tab = await landOn(trip.url);
  assert.equal(tab.error, null, `initialize(): ${JSON.stringify(tab.error)}`);
  const again = (await tab.client.getSession()).data.session;
  assert.ok(again, 'a session');
  assert.equal(again.user.id, userId);
  assert.equal(again.provider_token, 'gho_16C7e42F292c6912E7710c838347Ae178B4a', 'provider_token');
}

/**
 * A contested confirmation: an attacker signs up for the owner's address with the attacker's
 * password before the owner does; the owner signs up too and confirms from the mail in the owner's
 * mailbox. The owner's sign-up comes within the address's mail interval (AUTH_MAIL_INTERVAL_SECS,
 * 60 s), so it is held back quietly and the mailbox holds one confirmation mail: the one issued for
 * the attacker's sign-up (the two would look alike anyway). Nothing the attacker chose survives.
 */
async function contested() {
  const email = `olive.${RUN_ID}@example.org`;
  const ATTACKER_PASSWORD = 'Attacker-Chose-1';
  const attacker = newClient();
  const owner = newClient();

  begin('the attacker signs up first: no session');
  let { data, error } = await attacker.signUp({ email, password: ATTACKER_PASSWORD, options: { data: { full_name: 'Mallory' } } });
  assert.equal(error, null, `attacker signUp: ${JSON.stringify(error)}`);
  assert.equal(data.session, null);
  ({ data, error } = await attacker.signInWithPassword({ email, password: ATTACKER_PASSWORD }));
  expectApiError(error, 'email_not_confirmed', 400, 'attacker sign-in before any confirmation');

  begin('the owner signs up: the same answer as a new account');
  ({ data, error } = await owner.signUp({ email, password: PASSWORD, options: { data: { full_name: 'Olive' } } }));
  assert.equal(error, null, `owner signUp: ${JSON.stringify(error)}`);
  assert.equal(data.session, null);
  assert.equal(data.user.email, email);

  begin('the owner confirms from the mail in the mailbox');
  const mail = await waitMail(email, 1);
  ({ data, error } = await owner.verifyOtp({ token_hash: tokenHashOf(mail), type: 'email' }));
  const s = expectSession(data, error, 'owner confirmation');
  assert.equal(s.user.email, email);
  assert.ok(s.user.email_confirmed_at);
  assert.equal(s.user.user_metadata.full_name, undefined, `no pre-proof user_metadata: ${JSON.stringify(s.user.user_metadata)}`);

  begin("the attacker's refreshSession() fails: it has no session");
  const attackerStart = requests.length;
  ({ data, error } = await attacker.refreshSession());
  assert.ok(error, 'the attacker has nothing to refresh');
  assert.equal(error.name, 'AuthSessionMissingError', JSON.stringify(error));
  assert.equal(data.session, null);
  assert.deepEqual(requestsSince(attackerStart), [], 'the client had no refresh token to send');

  begin("the attacker's password does not sign in");
  ({ data, error } = await attacker.signInWithPassword({ email, password: ATTACKER_PASSWORD }));
  expectApiError(error, 'invalid_credentials', 400, "attacker's password after the owner's confirmation");
  assert.equal(data.session, null);

  begin("the owner's session refreshes");
  ({ data, error } = await owner.refreshSession());
  const s2 = expectSession(data, error, 'owner refresh');
  assert.notEqual(s2.refresh_token, s.refresh_token);
  assert.equal(s2.user.id, s.user.id);
  ({ data, error } = await owner.getUser());
  assert.equal(error, null, `owner getUser: ${JSON.stringify(error)}`);
  assert.equal(data.user.email, email);

  begin('no password chosen before the proof is active: the owner is mailed a set-password notice');
  ({ data, error } = await newClient().signInWithPassword({ email, password: PASSWORD }));
  expectApiError(error, 'invalid_credentials', 400, "owner's pre-proof password after a contested confirmation");
  const notice = await waitMailWithSubject(email, 'Your email is confirmed: choose a password', 1);
  assert.ok(urlsIn(notice.body).some((u) => new URL(u).pathname.endsWith('/verify')), 'the notice has a set-password link');

  begin('the owner sets a password in the session and signs in with it');
  ({ data, error } = await owner.updateUser({ password: PASSWORD2 }));
  assert.equal(error, null, `updateUser({password}): ${JSON.stringify(error)}`);
  ({ data, error } = await newClient().signInWithPassword({ email, password: PASSWORD2 }));
  const s3 = expectSession(data, error, 'owner sign-in with the new password');
  assert.equal(s3.user.id, s.user.id);
}

/**
 * A PKCE sign-up (flowType 'pkce', the verifier in client A's own storage) whose confirmation link
 * is opened in another browser: GoTrue confirms the address when the link is followed and
 * redirects with `?code=`; the other browser cannot exchange the code (no verifier; auth-js fails
 * before any request), the server refuses a missing or wrong verifier, and client A signs in with
 * its password and can still exchange the code with its verifier.
 */
async function pkceOtherBrowser() {
  const email = `pia.${RUN_ID}@example.org`;
  const callback = `${APP_URL}/auth/callback`;
  const a = newClient({ flowType: 'pkce' });

  begin('client A (PKCE) signs up');
  const signupStart = requests.length;
  let { data, error } = await a.signUp({ email, password: PASSWORD, options: { emailRedirectTo: callback } });
  assert.equal(error, null, `signUp: ${JSON.stringify(error)}`);
  assert.equal(data.session, null);
  const userId = data.user.id;
  const body = JSON.parse(requests.slice(signupStart).find((r) => r.path === '/auth/v1/signup').body);
  assert.equal(body.code_challenge_method, 's256');

  begin('another browser opens the confirmation link: 303 to the app with ?code=');
  const link = verifyLinkOf(await waitMail(email, 1));
  assert.ok(new URL(link).searchParams.get('token').startsWith('pkce_'), `a PKCE link: ${link}`);
  const r = await fetch(onApi(link), { redirect: 'manual' });
  const loc = r.headers.get('location');
  assert.equal(r.status, 303, `GET /verify: ${r.status} ${loc}`);
  const back = new URL(loc);
  assert.equal(`${back.origin}${back.pathname}`, callback, loc);
  const code = back.searchParams.get('code');
  assert.ok(code, `?code= in ${loc}`);

  begin("the other browser's client has no verifier: no session");
  const tab = await landOn(loc, { flowType: 'pkce' });
  assert.equal(tab.error, null, `a code without a stored verifier is not a callback for it: ${JSON.stringify(tab.error)}`);
  assert.equal((await tab.client.getSession()).data.session, null);
  const b = newClient({ flowType: 'pkce' });
  const exStart = requests.length;
  ({ data, error } = await b.exchangeCodeForSession(code));
  assert.ok(error, 'no exchange without the verifier');
  assert.equal(error.name, 'AuthPKCECodeVerifierMissingError', JSON.stringify(error));
  assert.equal(error.code, 'pkce_code_verifier_not_found');
  assert.equal(error.status, 400);
  assert.equal(data.session, null);
  assert.deepEqual(requestsSince(exStart), [], 'auth-js fails before any request');

  begin('the server refuses the code with no verifier or a wrong one');
  const exchange = async (verifier) => {
    const res = await fetch(`${AUTH_URL}/token?grant_type=pkce`, {
      method: 'POST',
      headers: { 'content-type': 'application/json;charset=UTF-8', 'x-supabase-api-version': '2024-01-01' },
      body: JSON.stringify({ auth_code: code, code_verifier: verifier }),
    });
    return { status: res.status, body: await res.json() };
  };
  let ex = await exchange('');
  assert.deepEqual([ex.status, ex.body.code], [400, 'validation_failed'], JSON.stringify(ex));
  ex = await exchange('0'.repeat(112));
  assert.deepEqual([ex.status, ex.body.code], [400, 'bad_code_verifier'], JSON.stringify(ex));

  begin('the address is confirmed: client A signs in with its password');
  ({ data, error } = await a.signInWithPassword({ email, password: PASSWORD }));
  const s = expectSession(data, error, 'client A password sign-in');
  assert.equal(s.user.id, userId);
  assert.ok(s.user.email_confirmed_at, 'email_confirmed_at');

  begin("client A can still exchange the code with its verifier");
  ({ data, error } = await a.exchangeCodeForSession(code));
  const xs = expectSession(data, error, 'client A exchange');
  assert.equal(xs.user.id, userId);
  assert.notEqual(xs.refresh_token, s.refresh_token, 'a session of its own');
}

try {
  if (scenario === 'main') await main();
  else if (scenario === 'expired') await expired();
  else if (scenario === 'email_change') await emailChange();
  else if (scenario === 'oauth_unverified') await oauthUnverified();
  else if (scenario === 'contested') await contested();
  else if (scenario === 'pkce_other_browser') await pkceOtherBrowser();
  else throw new Error(`unknown scenario ${scenario}`);
  report.done = true;
  report.requests = requests.map((r) => `${r.method} ${r.path}${r.query} → ${r.status}`);
  console.log(JSON.stringify(report));
} catch (e) {
  console.log(JSON.stringify({
    ok: false,
    step,
    error: String(e && e.stack ? e.stack : e),
    requests: requests.map((r) => `${r.method} ${r.path}${r.query} → ${r.status}`),
  }));
  process.exit(1);
}
