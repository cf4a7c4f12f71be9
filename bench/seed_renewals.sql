-- :n users, each with an email address and a paid PRO subscription that is
-- `active`, not cancelling, and whose current period ends within the next
-- hour by the database's clock: subscription u ends at now() + u/n hours,
-- so the ends are spread evenly over (now(), now() + 1 hour]. User u's id is
-- 00000000-0000-4000-9000-(u in hex, 12 digits) (bench/seed_payments.sql's
-- users are ...-8000-..., so the two seeds never collide). Used by
-- bench/run.sh's renewals section.
INSERT INTO users (id, email, created_at)
SELECT ('00000000-0000-4000-9000-' || lpad(to_hex(u), 12, '0'))::uuid,
       'renew' || u || '@example.com', now() - interval '1 month'
FROM generate_series(1, :n) u;

INSERT INTO subscriptions (user_id, plan, status, cancel_at_period_end,
                           current_period_start, current_period_end,
                           created_at, updated_at)
SELECT ('00000000-0000-4000-9000-' || lpad(to_hex(u), 12, '0'))::uuid,
       'PRO', 'active', false,
       now() + interval '1 hour' * u / :n - interval '1 month',
       now() + interval '1 hour' * u / :n,
       now() - interval '1 month', now() - interval '1 month'
FROM generate_series(1, :n) u;

-- Vacuumed and checkpointed here so neither autovacuum of the fresh rows nor
-- the seed's checkpoint lands inside the measured run.
VACUUM (ANALYZE) users;
VACUUM (ANALYZE) subscriptions;
CHECKPOINT;
