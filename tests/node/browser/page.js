// The page of the browser test (bundled by esbuild into dist/page.js and
// served by tests/tests/browser.rs from another origin than the API's). It
// uses the API as a frontend does: @supabase/auth-js for the session, fetch
// with `Authorization: Bearer` for /api, the signed upload URL for the
// avatar, and the `ai` package's DefaultChatTransport + readUIMessageStream
// for the chat. flow.mjs calls the functions of `window.app` one step at a
// time; every step also shows its result in the page.
import { AuthClient } from '@supabase/auth-js';
import { DefaultChatTransport, readUIMessageStream } from 'ai';

const API = new URLSearchParams(location.search).get('api');

const auth = new AuthClient({
  url: `${API}/auth/v1`,
  headers: { apikey: 'public-anon-key', 'X-Client-Info': 'browser-test' },
  storageKey: 'sb-browser-test',
  flowType: 'implicit',
  detectSessionInUrl: true,
  persistSession: true,
  autoRefreshToken: false,
});

function show(id, text) {
  document.getElementById(id).textContent = String(text);
}

async function token() {
  const { data } = await auth.getSession();
  return data.session?.access_token;
}

/** fetch on the API with the session's bearer token; JSON in and out. */
async function call(path, { method = 'GET', json, headers = {} } = {}) {
  const h = { ...headers };
  const t = await token();
  if (t) h.Authorization = `Bearer ${t}`;
  let body;
  if (json !== undefined) {
    h['Content-Type'] = 'application/json';
    body = JSON.stringify(json);
  }
  const r = await fetch(`${API}${path}`, { method, headers: h, body });
  const text = await r.text();
  let parsed;
  try {
    parsed = JSON.parse(text);
  } catch {
    parsed = text;
  }
  return {
    status: r.status,
    body: parsed,
    request_id: r.headers.get('x-request-id'),
    cache_control: r.headers.get('cache-control'),
  };
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function textOf(message) {
  return (message?.parts ?? [])
    .filter((p) => p.type === 'text')
    .map((p) => p.text)
    .join('');
}

window.app = {
  async signUp(email, password) {
    const back = `${location.origin}${location.pathname}${location.search}`;
    const { data, error } = await auth.signUp({ email, password, options: { emailRedirectTo: back } });
    if (error) throw new Error(`signUp: ${error.message}`);
    show('status', 'check your mail');
    return { session: Boolean(data.session), email: data.user?.email ?? null };
  },

  async session() {
    const { data, error } = await auth.getSession();
    if (error) throw new Error(`getSession: ${error.message}`);
    const s = data.session;
    show('who', s ? s.user.email : 'signed out');
    return s ? { id: s.user.id, email: s.user.email, hash_cleared: !location.hash.includes('access_token') } : null;
  },

  async me() {
    const r = await call('/api/me');
    if (r.status === 200) show('plan', r.body.subscription.plan);
    return r;
  },

  async plans() {
    return call('/api/plans');
  },

  async uploadAvatar() {
    const canvas = document.createElement('canvas');
    canvas.width = 16;
    canvas.height = 16;
    const ctx = canvas.getContext('2d');
    ctx.fillStyle = '#3366ff';
    ctx.fillRect(0, 0, 16, 16);
    const blob = await new Promise((r) => canvas.toBlob(r, 'image/png'));
    const grant = await call('/api/profile/avatar', {
      method: 'POST',
      json: { fileSize: blob.size, fileType: 'image/png' },
    });
    if (grant.status !== 200) return { step: 'grant', ...grant };
    const put = await fetch(grant.body.signedUrl, {
      method: 'PUT',
      headers: { 'Content-Type': 'image/png', 'x-upsert': 'true' },
      body: blob,
    });
    if (put.status !== 200) return { step: 'upload', status: put.status, body: await put.text() };
    const { data } = await auth.getSession();
    const id = data.session.user.id;
    const publicUrl = `${API}/storage/v1/object/public/avatars/${id}/avatar`;
    const saved = await call('/api/profile', {
      method: 'POST',
      json: { avatar_path: `${id}/avatar`, avatar_url: publicUrl },
    });
    if (saved.status !== 200) return { step: 'profile', ...saved };
    const img = document.getElementById('avatar');
    img.src = `${publicUrl}?v=${Date.now()}`;
    await img.decode();
    return {
      step: 'done',
      signed_url: grant.body.signedUrl,
      avatar_url: publicUrl,
      width: img.naturalWidth,
      height: img.naturalHeight,
    };
  },

  async checkout(plan) {
    const r = await call('/api/payments', {
      method: 'POST',
      json: { plan },
      headers: { 'Idempotency-Key': crypto.randomUUID() },
    });
    if (r.status === 200) show('payment', `${r.body.orderId}: PENDING`);
    return r;
  },

  /** What a billing return page does: poll the order until its status is final. */
  async waitPaid(orderId, timeoutMs) {
    const end = Date.now() + timeoutMs;
    let polls = 0;
    for (;;) {
      const r = await call(`/api/payments/${encodeURIComponent(orderId)}`);
      polls += 1;
      if (r.status !== 200) return { polls, ...r };
      show('payment', `${orderId}: ${r.body.status}`);
      if (r.body.status !== 'PENDING' || Date.now() > end) return { polls, ...r };
      await sleep(250);
    }
  },

  async chat(text) {
    const transport = new DefaultChatTransport({
      api: `${API}/api/ai/chat`,
      headers: { Authorization: `Bearer ${await token()}` },
    });
    const stream = await transport.sendMessages({
      trigger: 'submit-message',
      chatId: 'browser-chat',
      messageId: undefined,
      messages: [{ id: 'u1', role: 'user', parts: [{ type: 'text', text }] }],
      abortSignal: undefined,
    });
    let last;
    let updates = 0;
    let failure;
    for await (const m of readUIMessageStream({ stream, onError: (e) => { failure = e; }, terminateOnError: true })) {
      last = m;
      updates += 1;
      show('chat', textOf(m));
    }
    if (failure) throw failure;
    return { role: last?.role ?? null, text: textOf(last), updates };
  },

  async signOut() {
    const { error } = await auth.signOut();
    const { data } = await auth.getSession();
    show('who', data.session ? data.session.user.email : 'signed out');
    const me = await call('/api/me');
    return { error: error?.message ?? null, session: Boolean(data.session), me_status: me.status };
  },

  /**
   * What became of this origin's calls to the API, each one of:
   * `status N` (the browser let the page read the answer), `session …` /
   * `error (…)` for the sign-in (auth-js read an answer), `blocked by CORS`
   * (the page could not read the answer, yet the API did answer: the same URL
   * fetched `no-cors` gives an opaque response), or `unreachable` (no answer
   * at all, `no-cors` fails too). Only `blocked by CORS` proves the CORS rule.
   */
  async probe(email, password) {
    const out = {};
    const unread = async (url, e) => {
      try {
        const r = await fetch(url, { mode: 'no-cors', cache: 'no-store' });
        return `blocked by CORS (${e.name}; no-cors answer: ${r.type})`;
      } catch (e2) {
        return `unreachable (${e.name}; no-cors: ${e2.name})`;
      }
    };
    for (const [name, path] of [['plans', '/api/plans'], ['health', '/api/health']]) {
      try {
        const r = await fetch(`${API}${path}`, { cache: 'no-store' });
        out[name] = `status ${r.status}`;
      } catch (e) {
        out[name] = await unread(`${API}${path}`, e);
      }
    }
    const token = `${API}/auth/v1/token?grant_type=password`;
    try {
      const { data, error } = await auth.signInWithPassword({ email, password });
      if (error?.name === 'AuthRetryableFetchError') out.sign_in = await unread(token, error);
      else out.sign_in = error ? `error (${error.name})` : `session ${Boolean(data.session)}`;
    } catch (e) {
      out.sign_in = await unread(token, e);
    }
    return out;
  },
};
show('status', 'ready');
