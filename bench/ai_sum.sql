-- pgbench: the quota counter's seed, the sum the api runs once per user and
-- month when the Redis counter is absent (entity::ai::limits::tokens_this_month:
-- user_id = $1 and created_at >= the first of the month, UTC), for a random
-- bench user (-D users=<count of bench_ai_users>; the user id comes from that
-- table by its primary key).
\set k random(0, :users - 1)
select coalesce(sum(input_tokens + output_tokens), 0) as total from ai_usage
 where user_id = (select id from bench_ai_users where n = :k)
   and created_at >= date_trunc('month', now() at time zone 'UTC') at time zone 'UTC';
