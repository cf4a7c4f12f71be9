-- pgbench script: one single-row INSERT into a scratch table (the database's
-- own write limit, the yardstick of the payment figures).
INSERT INTO bench_insert (order_id, amount) VALUES ('ORD-' || (random() * 1e12)::bigint, 99000);
