-- :n ai_usage rows spread round robin over the users listed in
-- bench_ai_users (n, id), created over the last 40 days (so part of them
-- falls in the previous month, which the quota sum must skip). One INSERT.
insert into ai_usage (id, user_id, provider, model, route, input_tokens, output_tokens,
                      aborted, estimated, created_at)
select gen_random_uuid(), b.id, 'openai', 'gpt-4o-mini',
       case when g % 4 = 0 then 'generate' else 'chat' end,
       20 + (g % 200)::int, 100 + (g % 400)::int, false, false,
       now() - ((g::bigint * 7919) % (40 * 86400)) * interval '1 second'
from generate_series(0, :n - 1) g
join bench_ai_users b on b.n = g % (select count(*) from bench_ai_users);
analyze ai_usage;
