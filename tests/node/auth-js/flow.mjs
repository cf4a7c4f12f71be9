// The real `@supabase/auth-js` GoTrueClient against our built-in identity
// provider (`/auth/v1`). Run by tests/tests/auth_js_client.rs, which starts the
// api + worker and an HTTP endpoint listing the mails the SMTP sink received.
//
//   node flow.mjs <scenario>        scenario: main | expired
//
// Environment: API_URL (base of the api, no trailing slash), MAILS_URL (GET →
// JSON array of {to: [..], subject, body}), APP_URL (the app's origin),
// RUN_ID (makes the email addresses unique).
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

try {
  if (scenario === 'main') await main();
  else if (scenario === 'expired') await expired();
  else throw new Error(`unknown scenario ${scenario}`);
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
