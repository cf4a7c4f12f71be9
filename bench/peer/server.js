// The Node peer of POST /api/contact, as a Node team would ship it: Express 5,
// zod for the body, rate-limiter-flexible in Redis, the email job queued with
// BullMQ; one process per core (node:cluster). Used by `bash bench/run.sh
// peer-contact` only, against the same Redis as the api.
//
// Same rules as the api's route: JSON object with exactly name, email,
// message; name 1-100 and message 1-5,000 characters, each not only
// whitespace and without NUL; email an address of at most 254 characters;
// 64 KiB body limit; RATE_LIMIT_PUBLIC_PER_HOUR (default 5) requests per hour
// per client IP (X-Forwarded-For trusted, as the bench runs the api with
// TRUST_PROXY=true); 200 `{ "success": true }` with the X-RateLimit-* headers
// once the job is queued.
//
// Environment: PORT (18090), WORKERS (the number of cores), REDIS_URL
// (redis://127.0.0.1:6379), QUEUE_PREFIX (bull), RATE_LIMIT_PUBLIC_PER_HOUR,
// EMAIL_FROM, CONTACT_EMAIL.
'use strict';

const cluster = require('node:cluster');
const os = require('node:os');

const port = Number(process.env.PORT || 18090);
const workers = Number(process.env.WORKERS || os.availableParallelism());

if (cluster.isPrimary) {
  let up = 0;
  for (let i = 0; i < workers; i++) cluster.fork();
  cluster.on('listening', () => {
    if (++up === workers) console.log(`listening on 127.0.0.1:${port} with ${workers} workers`);
  });
  cluster.on('exit', (w, code, signal) => {
    console.error(`worker ${w.process.pid} exited (${signal || code})`);
  });
  for (const sig of ['SIGTERM', 'SIGINT']) {
    process.on(sig, () => {
      for (const w of Object.values(cluster.workers)) w.kill(sig);
      process.exit(0);
    });
  }
} else {
  serve();
}

function serve() {
  const crypto = require('node:crypto');
  const express = require('express');
  const { z } = require('zod');
  const Redis = require('ioredis');
  const { RateLimiterRedis } = require('rate-limiter-flexible');
  const { Queue } = require('bullmq');

  const redisUrl = process.env.REDIS_URL || 'redis://127.0.0.1:6379';
  const prefix = process.env.QUEUE_PREFIX || 'bull';
  const perHour = Number(process.env.RATE_LIMIT_PUBLIC_PER_HOUR || 5);
  const from = process.env.EMAIL_FROM || 'site@example.com';
  const inbox = process.env.CONTACT_EMAIL || from;

  const redis = new Redis(redisUrl, { enableOfflineQueue: false });
  const limiter = new RateLimiterRedis({
    storeClient: redis,
    keyPrefix: `${prefix}:peer:rl:contact`,
    points: perHour,
    duration: 3600,
  });
  const queue = new Queue('peer-email', {
    prefix,
    connection: new Redis(redisUrl, { maxRetriesPerRequest: null }),
    defaultJobOptions: { attempts: 8, backoff: { type: 'exponential', delay: 2000 } },
  });

  // "Not only whitespace": a character outside Unicode White_Space; no NUL.
  const notBlank =
    /^[^\u0000]*[^\t\n\v\f\r \u0000\u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000][^\u0000]*$/;
  const text = (max) =>
    z
      .string()
      .refine((s) => [...s].length >= 1 && [...s].length <= max, `must have 1-${max} characters`)
      .regex(notBlank, 'must not be only whitespace or hold NUL');
  const ContactRequest = z.strictObject({
    name: text(100),
    email: z.email().max(254),
    message: text(5000),
  });

  const problem = (res, status, code, detail, field) =>
    res
      .status(status)
      .type('application/problem+json')
      .send(JSON.stringify({ type: 'about:blank', title: code, status, code, detail, field }));

  const app = express();
  app.disable('x-powered-by');
  app.set('trust proxy', true);
  app.use((req, res, next) => {
    res.set('x-request-id', crypto.randomUUID());
    next();
  });
  app.post('/api/contact', express.json({ limit: '64kb', strict: true }), async (req, res) => {
    const parsed = ContactRequest.safeParse(req.body);
    if (!parsed.success) {
      const issue = parsed.error.issues[0];
      const field = issue.path[0] ?? (issue.keys && issue.keys[0]);
      return problem(res, 400, issue.code, issue.message, field);
    }
    const body = parsed.data;
    let rate;
    try {
      rate = await limiter.consume(req.ip);
    } catch (e) {
      if (e instanceof Error) return problem(res, 503, 'rate_limit_unavailable', e.message);
      res.set('Retry-After', String(Math.ceil(e.msBeforeNext / 1000)));
      return problem(res, 429, 'rate_limited', 'too many requests; try again later');
    }
    res.set({
      'X-RateLimit-Limit': String(perHour),
      'X-RateLimit-Remaining': String(rate.remainingPoints),
      'X-RateLimit-Reset': String(Math.ceil(rate.msBeforeNext / 1000)),
    });
    try {
      await queue.add('send-email', {
        email: {
          from,
          to: [inbox],
          reply_to: body.email.trim(),
          subject: `Contact form: ${body.name.trim()}`,
          text: `From: ${body.name.trim()} <${body.email.trim()}>\n\n${body.message.trim()}`,
        },
        request_id: res.get('x-request-id'),
      });
    } catch (e) {
      return problem(res, 503, 'queue_unavailable', 'the message could not be queued; try again shortly');
    }
    res.json({ success: true });
  });
  app.use((err, req, res, next) => {
    if (err.type === 'entity.too.large') return problem(res, 413, 'payload_too_large', err.message);
    if (err.status === 400) return problem(res, 400, 'invalid_json', err.message);
    next(err);
  });
  app.listen(port, '127.0.0.1');
}
