-- :n PENDING provider_a payments of PRO (99,000 IDR) owned by up to 10,000
-- users, in one INSERT ... SELECT each. Order ids have the documented form
-- <prefix>-<epoch ms>-<8 upper-case alphanumerics>: payment i is
-- ORD-(1764000000000 + i)-(i in upper-case hex, 8 digits), so scripts can
-- rebuild any order id from i (bench/lookup.sql does). User u's id is
-- 00000000-0000-4000-8000-(u in hex, 12 digits).
INSERT INTO users (id, email, created_at)
SELECT ('00000000-0000-4000-8000-' || lpad(to_hex(u), 12, '0'))::uuid,
       'seed' || u || '@example.com', now()
FROM generate_series(1, least(10000, :n)) u
ON CONFLICT DO NOTHING;

INSERT INTO payments (id, order_id, user_id, plan, amount, currency, provider, status, created_at, updated_at)
SELECT gen_random_uuid(),
       'ORD-' || (1764000000000 + i) || '-' || lpad(upper(to_hex(i)), 8, '0'),
       ('00000000-0000-4000-8000-' || lpad(to_hex(1 + i % least(10000, :n)), 12, '0'))::uuid,
       'PRO', 99000, 'IDR', 'provider_a', 'PENDING', now(), now()
FROM generate_series(1, :n) i;

-- Vacuumed and checkpointed here so neither autovacuum of the fresh rows nor
-- the seed's checkpoint lands inside the measured runs.
VACUUM (ANALYZE) users;
VACUUM (ANALYZE) payments;
CHECKPOINT;
