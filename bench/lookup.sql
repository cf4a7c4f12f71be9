-- pgbench script: the webhook's payment lookup (entity::billing::events::record_event:
-- the payment by order id and provider) for a random seeded payment i in
-- 1..:rows (order ids as bench/seed_payments.sql writes them; building the
-- id in SQL costs the same at every table size).
\set i random(1, :rows)
SELECT id, order_id, user_id, plan, amount, currency, provider, status, checkout_token, payment_url, provider_reference, paid_at, idempotency_key, reconciled_at, created_at, updated_at FROM payments WHERE order_id = 'ORD-' || (1764000000000 + :i::bigint) || '-' || lpad(upper(to_hex(:i::bigint)), 8, '0') AND provider = 'provider_a' LIMIT 1;
