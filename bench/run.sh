#!/usr/bin/env bash
# Load figures for BENCHMARKS.md: release api + worker against local PostgreSQL
# and Redis, wrk on loopback, a bare poem route measured in the same run.
#
#   bash bench/run.sh            # everything; needs wrk (apt-get install wrk)
#   bash bench/run.sh profile jwks upload   # only these sections
#
# Sections: bare health contact waitlist drain (issue 2), profile jwks upload verify (issue 3),
# peer-contact (POST /api/contact against its Node peer in bench/peer) and callgrind
# (instructions per request) are not in the default list,
# payments-seed webhook webhook256 settle lookup pgbench checkout (issue 8; checkout is not
# in the default list: run it by name).
#   bash bench/run.sh payments-seed webhook webhook256 settle lookup pgbench
# AI (issue 9; not in the default list, run by name): ai-ttfb ai-ttfb-parts ai-streams ai-generate ai-quota
#   bash bench/run.sh ai-ttfb ai-streams ai-generate ai-quota
# Identity (issue 10; not in the default list, run by name): auth-signin auth-refresh auth-user auth-settings
#   bash bench/run.sh auth-signin auth-refresh auth-user auth-settings
# Reads (issue 29; not in the default list, run by name): me (GET /api/me, warm
# caller, vs GET /api/health in the same run)
#   bash bench/run.sh me
# Operations (issue 30; not in the default list, run by name): metrics (on vs off on
# POST /api/contact), shed (1,024 connections on POST /api/waitlist with shedding on,
# clients ignoring Retry-After, then honouring it)
#   bash bench/run.sh metrics shed
# Worker scaling (not in the default list; run it alone: the fake email API then
# answers in 5 ms for the whole run): drain-scale (DRAIN_JOBS, 100,000, email
# jobs drained by 1, 2 and 4 worker processes; throughput of each as a ratio of one)
#   bash bench/run.sh drain-scale
# Renewals at scale (not in the default list; run it alone: the fake
# email API then answers in 50 ms): renewals (RENEWAL_SUBS, 100,000, paid
# subscriptions ending within the hour; two workers make every renewal and
# send every reminder; seconds to each, renewals/s and reminders/s)
#   bash bench/run.sh renewals
# Two builds compared in turns (bench/compare.sh: run.sh per build and turn,
# then one table per measured run: req/s, p99, CPU per request):
#   BEFORE=/work/base/target/release bash bench/compare.sh health waitlist payments-seed webhook \
#     ai-generate auth-user auth-refresh
# BIN (default target/release) picks the binaries; NO_BUILD=1 skips the release
# build, e.g. a smoke test with debug binaries:
#   BIN=target/debug NO_BUILD=1 DUR=3s bash bench/run.sh ai-ttfb
# API_ENV adds variables to the api's environment only (e.g.
# API_ENV=TOKIO_WORKER_THREADS=1); API_CPUS / CLIENT_CPUS pin the api and the
# ttfb clients to cores (taskset lists):
#   API_CPUS=1 CLIENT_CPUS=0 TTFB_N=1000 bash bench/run.sh ai-ttfb ai-ttfb-parts
# CLIENT_RT=<priority> runs the ttfb clients under SCHED_FIFO (chrt -f), so a
# client woken by its first byte takes a core at once instead of waiting for
# one the api, the fake or PostgreSQL holds, as a client on its own machine
# does; needs root:
#   CLIENT_RT=50 TTFB_N=1000 bash bench/run.sh ai-ttfb
# Every request loop is bounded (wrk -d, pgbench -T, settle by SETTLE_MAX_SECS,
# drain-scale by DRAIN_FILL_SECS and DRAIN_MAX_SECS, renewals by RENEWAL_MAX_SECS,
# bench_peer load by its seconds);
# all traffic stays on 127.0.0.1.
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=${DUR:-15s}
CONN=${CONN:-64}
THREADS=${THREADS:-2}
export THREADS  # read by the wrk scripts that split their input per thread
PEER=127.0.0.1:${PEER_PORT:-19999}
API_PORT=${API_PORT:-18080}
DB=bench_$$
PREFIX=bench$$
OUT=${OUT:-target/bench}
PROVIDER_A_KEY=SB-Mid-server-bench0123456789
mkdir -p "$OUT"

BIN=${BIN:-target/release}
[ -n "${NO_BUILD:-}" ] || cargo build --release -q -p api -p worker --bins --example bench_peer
SECTIONS=${*:-bare health contact waitlist drain profile jwks upload verify payments-seed webhook webhook256 settle lookup pgbench}
want() { [[ " $SECTIONS " == *" $1 "* ]]; }
# The AI sections use a catalogue whose FREE plan (every new user's) has its
# AI limits raised (bench/ai_plans.toml); the other plans are unchanged.
# BENCH_PLANS replaces config/plans.toml for the other sections (compare.sh
# gives an older api the catalogue of its own commit, which it can parse).
PLANS=${BENCH_PLANS:-config/plans.toml}
[[ " $SECTIONS " == *" ai-"* ]] && PLANS=bench/ai_plans.toml
# The auth sections run the api as its own identity provider (AUTH_PROVIDER=
# builtin), new accounts confirmed at once, the per-IP auth limits out of the way.
AUTH_ENV=()
[[ " $SECTIONS " == *" auth-"* ]] && AUTH_ENV=(AUTH_PROVIDER=builtin AUTH_AUTOCONFIRM=true
  AUTH_RATE_LIMIT_PER_5MIN=100000000 AUTH_RATE_LIMIT_REFRESH_PER_5MIN=100000000)
# 500 concurrent chats hold ~1,000 sockets in the api (client + upstream side).
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

EXTRA_PIDS=()
cleanup() {
  kill "${API_PID:-}" "${WORKER_PID:-}" "${PEER_PID:-}" "${NODE_PID:-}" "${EXTRA_PIDS[@]}" 2>/dev/null || true
  wait 2>/dev/null || true
  psql -h 127.0.0.1 -U postgres -qc "drop database if exists $DB with (force)" >/dev/null 2>&1 || true
  psql -h 127.0.0.1 -U postgres -qc "drop database if exists ${DB}_1k with (force)" >/dev/null 2>&1 || true
  redis-cli --scan --pattern "$PREFIX:*" | xargs -r -n 500 redis-cli del >/dev/null || true
}
trap cleanup EXIT

psql -h 127.0.0.1 -U postgres -qc "create database $DB"
if curl -s -o /dev/null "http://$PEER/count"; then echo "port of $PEER is taken; set PEER_PORT" >&2; exit 1; fi
# EMAIL_DELAY_MS: how long the fake email API takes to answer; 5 ms when the
# drain-scale section runs, 50 ms when the renewals section runs (for the
# whole run: run either alone), else 0.
EMAIL_DELAY_MS=${EMAIL_DELAY_MS:-$(want drain-scale && echo 5 || { want renewals && echo 50; } || echo 0)}
EMAIL_DELAY_MS=$EMAIL_DELAY_MS "$BIN/examples/bench_peer" "$PEER" > "$OUT/peer.log" 2>&1 & PEER_PID=$!
for _ in $(seq 1 50); do curl -s -o /dev/null "http://$PEER/count" && break; sleep 0.1; done

export DATABASE_URL="postgres://postgres@127.0.0.1:5432/$DB${PG_PARAMS:-}" REDIS_URL=redis://127.0.0.1:6379 \
  QUEUE_PREFIX=$PREFIX TRUST_PROXY=true RATE_LIMIT_PUBLIC_PER_HOUR=100000000 \
  EMAIL_PROVIDER_API_KEY=bench EMAIL_PROVIDER_BASE_URL=http://$PEER EMAIL_FROM=site@example.com \
  PLANS_FILE=$PLANS RUST_LOG=${RUST_LOG:-warn} HOST=127.0.0.1 PORT=$API_PORT \
  WORKER_CONCURRENCY=${WORKER_CONCURRENCY:-64} DB_MAX_CONNECTIONS=${DB_MAX_CONNECTIONS:-32} \
  NEXT_PUBLIC_BACKEND_URL=http://$PEER NEXT_PUBLIC_BACKEND_PUBLISHABLE_KEY=pk_bench \
  BACKEND_JWT_SECRET=bench-jwt-secret-0123456789abcdef0123 BACKEND_SERVICE_ROLE_KEY=bench-service-role-0123456789abcdef0123 \
  STORAGE_URL=file://$PWD/$OUT/storage \
  NEXT_PUBLIC_ENABLE_PAYMENTS=true PAYMENT_PROVIDER=provider_a PROVIDER_A_SERVER_KEY=$PROVIDER_A_KEY \
  PROVIDER_A_BASE_URL=http://$PEER PROVIDER_A_API_BASE_URL=http://$PEER \
  SETTLEMENT_SWEEP_AFTER_SECS=86400 PAYMENT_RECONCILE_AFTER_SECS=86400 \
  NEXT_PUBLIC_ENABLE_AI=true AI_DEFAULT_PROVIDER=openai OPENAI_API_KEY=sk-bench \
  OPENAI_BASE_URL=http://$PEER/v1 OPENAI_MODEL=gpt-4o-mini \
  OPENAI_COMPATIBLE_BASE_URL=http://127.0.0.1:${CLOSED_PORT:-9}/v1
# (openai_compatible points at a closed port: ai-ttfb-parts times a chat that
# passes every gate and then fails to connect.)
# The sweep and reconciliation are pushed out of the runs' way: the seeded
# payments are all PENDING and the settle section measures the queue, not the
# sweep re-queueing a backlog that is merely waiting.

# API_WRAP: a command the api runs under (the callgrind section's valgrind).
env "${AUTH_ENV[@]}" ${API_ENV:-} ${API_WRAP:-} "$BIN/api" > "$OUT/api.out" 2> "$OUT/api.err" & API_PID=$!
for _ in $(seq 1 $(( ${API_START_SECS:-10} * 5 ))); do grep -q listening "$OUT/api.out" 2>/dev/null && break; sleep 0.2; done
grep -q listening "$OUT/api.out" 2>/dev/null || { echo "the api did not start:" >&2; cat "$OUT/api.err" >&2; exit 1; }
BASE=http://127.0.0.1:$API_PORT
# API_CPUS / CLIENT_CPUS (taskset lists, e.g. 1 and 0): the api's threads and
# the ttfb clients on their own cores, so the client reading a first byte does
# not wait for a core the api holds (as a browser on its own machine would
# not); unset: the kernel places both (see BENCHMARKS.md, AI ttfb).
[ -n "${API_CPUS:-}" ] && taskset -a -p -c "$API_CPUS" "$API_PID" > /dev/null
CLIENT=()
[ -n "${CLIENT_CPUS:-}" ] && CLIENT=(taskset -c "$CLIENT_CPUS")
[ -n "${CLIENT_RT:-}" ] && CLIENT+=(chrt -f "$CLIENT_RT")

load() { echo "load average $(cut -d' ' -f1-3 /proc/loadavg)"; }
# CPU time a process has used (user + system), in milliseconds.
cpu_ms() { awk -v hz="$(getconf CLK_TCK)" '{print ($14 + $15) * 1000 / hz}' "/proc/$1/stat"; }
rss() { awk '/VmHWM/ {print $2/1024 " MiB peak"}' "/proc/$1/status"; }
# CPU time of several processes together (user + system), in milliseconds.
cpu_ms_sum() { # pids...
  local p files=()
  for p; do files+=("/proc/$p/stat"); done
  awk -v hz="$(getconf CLK_TCK)" '{s += $14 + $15} END {print s * 1000 / hz}' "${files[@]}"
}
# Server CPU per request of a wrk run, in microseconds: the servers' CPU since
# $1 (cpu_ms_sum at the start) over the requests wrk counted in $2.
cpu_per_request() { # cpu ms at the start, wrk output, pids...
  local n c1
  n=$(awk '/requests in/ {print $1; exit}' "$2")
  c1=$(cpu_ms_sum "${@:3}")
  echo "scale=1; ($c1 - $1) * 1000 / ${n:-1}" | bc
}
# CPU_PIDS: the processes whose CPU a run reports (default: the api).
run() { # name, wrk args...
  local name=$1; shift
  echo "### $name"
  local pids=(${CPU_PIDS:-$API_PID}) c0
  c0=$(cpu_ms_sum "${pids[@]}")
  wrk -t"$THREADS" -c"$CONN" -d"$DUR" --latency "$@" | tee "$OUT/$name.txt" | grep -E "Requests/sec|Latency|99%|Non-2xx|Socket errors" || true
  echo "$name: server CPU $(cpu_per_request "$c0" "$OUT/$name.txt" "${pids[@]}") µs per request (pids ${pids[*]})"
}

want bare && CPU_PIDS=$PEER_PID run bare http://$PEER/bare
want health && run health "$BASE/api/health"
want contact && run contact -s bench/contact.lua "$BASE/api/contact"
want waitlist && run waitlist -s bench/waitlist.lua "$BASE/api/waitlist"

# POST /api/contact against its Node peer (bench/peer: Express + zod +
# rate-limiter-flexible + BullMQ, one process per core, pinned by its
# package-lock.json), on the same Redis with the same limit, in turns
# ($PEER_TURNS, default 3: api, peer, api, peer, ...), each after a
# $PEER_WARM (5s) unmeasured warm-up. The peer's CPU is its primary's plus its
# workers'. Not in the default list: needs node and `npm ci` (done here when
# bench/peer/node_modules is missing).
if want peer-contact; then
  [ -d bench/peer/node_modules ] || (cd bench/peer && npm ci --no-audit --no-fund --loglevel=error)
  NODE_PORT=${NODE_PORT:-18090}
  PORT=$NODE_PORT QUEUE_PREFIX=$PREFIX node bench/peer/server.js > "$OUT/node-peer.out" 2> "$OUT/node-peer.err" & NODE_PID=$!
  for _ in $(seq 1 100); do grep -q listening "$OUT/node-peer.out" 2>/dev/null && break; sleep 0.2; done
  grep -q listening "$OUT/node-peer.out" || { echo "the node peer did not start:" >&2; cat "$OUT/node-peer.err" >&2; exit 1; }
  node_pids=("$NODE_PID" $(pgrep -P "$NODE_PID"))
  echo "### peer-contact: api pid $API_PID, node peer pids ${node_pids[*]}; $(load)"
  figures() { # name -> "req/s p99 non-2xx"
    awk '/Requests\/sec/ {r = $2} $1 == "99%" {p = $2} /Non-2xx/ {e = $NF} END {printf "%s %s %s", r, p, e + 0}' "$OUT/$1.txt"
  }
  to_ms() { awk -v v="$1" 'BEGIN {n = v + 0; u = v; sub(/^[0-9.]+/, "", u); print (u == "us" ? n / 1000 : u == "s" ? n * 1000 : n)}'; }
  summary=()
  for turn in $(seq 1 "${PEER_TURNS:-3}"); do
    for side in api node; do
      if [ "$side" = api ]; then pids=("$API_PID") url=$BASE; else pids=("${node_pids[@]}") url=http://127.0.0.1:$NODE_PORT; fi
      wrk -t"$THREADS" -c"$CONN" -d"${PEER_WARM:-5s}" -s bench/contact.lua "$url/api/contact" > /dev/null
      CPU_PIDS="${pids[*]}" run "peer-contact-$side-$turn" -s bench/contact.lua "$url/api/contact" | tee "$OUT/peer-contact-$side-$turn.cpu"
      read -r rps p99 bad <<< "$(figures "peer-contact-$side-$turn")"
      cpu=$(sed -n 's/.*server CPU \([0-9.]*\) µs.*/\1/p' "$OUT/peer-contact-$side-$turn.cpu")
      eval "${side}_rps=$rps ${side}_p99=$(to_ms "$p99") ${side}_bad=$bad ${side}_cpu=$cpu"
    done
    summary+=("turn $turn: api $api_rps req/s, p99 $api_p99 ms, $api_cpu µs CPU/request, $api_bad non-2xx | node $node_rps req/s, p99 $node_p99 ms, $node_cpu µs CPU/request, $node_bad non-2xx | api/node: throughput x$(echo "scale=2; $api_rps / $node_rps" | bc) (goal >= 2), p99 $(echo "scale=3; $api_p99 / $node_p99" | bc) (goal <= 0.5), CPU/request $(echo "scale=3; $api_cpu / $node_cpu" | bc) (goal <= 0.2)")
  done
  printf '%s\n' "${summary[@]}" | tee "$OUT/peer-contact.txt"
  echo "peer-contact: jobs queued by the node peer: $(redis-cli llen "$PREFIX:peer-email:wait"); api RSS: $(rss $API_PID); $(load)"
  kill "$NODE_PID" 2>/dev/null || true
  wait "$NODE_PID" 2>/dev/null || true
  NODE_PID=
fi

# Instructions per request, which a noisy host does not change: the api under
# callgrind, counters zeroed before and dumped after $CALLGRIND_N (2,000)
# sequential requests of each route in $CALLGRIND_ROUTES (contact health), after
# 200 unmeasured ones; the figure is the dump's `totals` (its `summary` line
# counts from the process's start, and after a zeroing can wrap around). Not in
# the default list; run it alone (with `--collect-atstart=no` or
# `--instr-atstart=no` the dumps count nothing: the toggle below does not take):
#   API_WRAP="valgrind --tool=callgrind --callgrind-out-file=target/bench/callgrind.%p" \
#     API_START_SECS=120 bash bench/run.sh callgrind
if want callgrind; then
  for route in ${CALLGRIND_ROUTES:-contact health}; do
    python3 bench/drive.py "$BASE" 200 "$route" > /dev/null
    callgrind_control -z "$API_PID" > /dev/null
    callgrind_control -i on "$API_PID" > /dev/null
    python3 bench/drive.py "$BASE" "${CALLGRIND_N:-2000}" "$route"
    callgrind_control -i off "$API_PID" > /dev/null
    callgrind_control -d "callgrind-$route" "$API_PID" > /dev/null
    dump=$(ls -t "$OUT"/callgrind.* | head -1)
    echo "callgrind $route: $(awk -v n="${CALLGRIND_N:-2000}" '/^totals:/ {printf "%.0f instructions per request", $2 / n; exit}' "$dump") ($dump; callgrind_annotate --inclusive=yes it)"
  done
fi

# Authenticated profile saves: 1,000 distinct users per token kind, over
# SESSION_CONN (default 16) connections. A 5 s pass first creates the users
# (first sight), then the measured run.
session_run() { # name, alg
  "$BIN/examples/bench_peer" tokens "$2" "$BACKEND_JWT_SECRET" 1000 > "$OUT/$1.tokens"
  TOKENS="$OUT/$1.tokens" wrk -t"$THREADS" -c"${SESSION_CONN:-16}" -d5s -s bench/profile.lua "$BASE/api/profile" > /dev/null
  TOKENS="$OUT/$1.tokens" CONN="${SESSION_CONN:-16}" run "$1" -s bench/profile.lua "$BASE/api/profile"
}
want profile && session_run profile HS256
want jwks && session_run jwks ES256
# In-process session verification: first check, then repeats of the same token
# (ES256: answered from the verified-token cache; HS256: decoded each time).
want verify && "$BIN/examples/bench_peer" verify "http://$PEER/auth/v1/.well-known/jwks.json" \
  "$BACKEND_JWT_SECRET" 20000 | tee "$OUT/verify.txt"
echo "api RSS: $(rss $API_PID)"

# Avatar uploads: 16 in parallel, 2 MiB each, to the filesystem store. The
# resting RSS is read before the first upload and the peak RSS is reset
# (clear_refs 5) then, so the figure is all the growth uploads cause.
if want upload; then
  size=$((2 * 1024 * 1024))
  python3 -c "import sys,os; sys.stdout.buffer.write(b'\x89PNG\r\n\x1a\n\0\0\0\rIHDR' + os.urandom($size - 16))" > "$OUT/avatar.png"
  "$BIN/examples/bench_peer" grants "$BACKEND_SERVICE_ROLE_KEY" 16 "$size" > "$OUT/grants.txt"
  rest=$(awk '/VmRSS/ {print $2}' "/proc/$API_PID/status")
  echo 5 > "/proc/$API_PID/clear_refs"
  AVATAR_FILE="$OUT/avatar.png" GRANTS="$OUT/grants.txt" wrk -t2 -c16 -d3s -s bench/upload.lua "$BASE" > /dev/null
  AVATAR_FILE="$OUT/avatar.png" GRANTS="$OUT/grants.txt" CONN=16 \
    run upload -s bench/upload.lua "$BASE"
  peak=$(awk '/VmHWM/ {print $2}' "/proc/$API_PID/status")
  echo "upload: api RSS before any upload $((rest / 1024)) MiB, peak during the uploads $((peak / 1024)) MiB, growth $(( (peak - rest) / 1024 )) MiB"
fi

if want drain; then
  # Drain: the contact run queued jobs while no worker ran; now start one.
  backlog() { echo $(( $(redis-cli llen "$PREFIX:email:active") + $(redis-cli zcard "$PREFIX:email:scheduled") )); }
  queued=$(backlog)
  echo "### worker drain: $queued jobs queued"
  start=$(date +%s.%N)
  "$BIN/worker" > "$OUT/worker.out" 2> "$OUT/worker.err" & WORKER_PID=$!
  while [ "$(backlog)" -gt 0 ]; do sleep 0.5; done
  # wait for in-flight jobs to be acknowledged
  for _ in $(seq 1 40); do
    inflight=$(redis-cli --scan --pattern "$PREFIX:email:inflight*" | xargs -r redis-cli scard 2>/dev/null | awk '{s+=$1} END {print s+0}')
    [ "$inflight" = 0 ] && break; sleep 0.25
  done
  end=$(date +%s.%N)
  sent=$(curl -s http://$PEER/count)
  echo "drained $queued jobs in $(echo "$end - $start" | bc) s: $(echo "$queued / ($end - $start)" | bc) jobs/s; email API received $sent"
  echo "worker RSS: $(rss $WORKER_PID)"
  echo "api RSS after all runs: $(rss $API_PID)"
  # The payment sections below measure ingestion with no worker running.
  kill "$WORKER_PID" 2>/dev/null || true
  wait "$WORKER_PID" 2>/dev/null || true
  WORKER_PID=
fi

# Drain scaling: DRAIN_JOBS (100,000) email jobs drained by 1, 2 and 4 worker
# processes (DRAIN_PROCS, default "1 2 4") against the fake email API answering
# in EMAIL_DELAY_MS (5 ms here, set when bench_peer starts; 0 for every other
# section). For each count: the queue is filled with no worker running, by
# POST /api/contact from `bench_peer load` (DRAIN_FILL_CONN, 64, connections;
# LOAD_REQUESTS=DRAIN_JOBS caps the requests, DRAIN_FILL_SECS, 600, bounds the
# time), the jobs queued are read from Redis, then the N workers start together
# (the same environment as the drain section: every queue served, each process
# with WORKER_CONCURRENCY=64 email jobs in flight, i.e. 4 apalis workers of 16,
# so 64 x N in all), and the clock stops when the email queue and its in-flight
# sets are empty and the fake has answered that many more emails (polled every
# 0.1 s, bounded by DRAIN_MAX_SECS, 600). Throughput is jobs over the time from
# the workers' start (their start-up included; also given from the first email
# answered), then each as a ratio of one process's. Not in the default list.
#   bash bench/run.sh drain-scale
if want drain-scale; then
  email_backlog() { echo $(( $(redis-cli llen "$PREFIX:email:active") + $(redis-cli zcard "$PREFIX:email:scheduled") )); }
  email_inflight() { redis-cli --scan --pattern "$PREFIX:email:inflight*" | xargs -r -n 1 redis-cli scard | awk '{s += $1} END {print s + 0}'; }
  sent() { curl -s "http://$PEER/count"; }
  jobs=${DRAIN_JOBS:-100000} procs=${DRAIN_PROCS:-1 2 4}
  declare -A rate=()
  summary=()
  echo "### drain-scale: $jobs email jobs per count, fake email API delay ${EMAIL_DELAY_MS} ms, WORKER_CONCURRENCY=$WORKER_CONCURRENCY per process; $(load)"
  for n in $procs; do
    [ "$(email_backlog)" = 0 ] || echo "drain-scale: $(email_backlog) email jobs were already queued; they are drained and counted too"
    LOAD_REQUESTS=$jobs "$BIN/examples/bench_peer" load "$BASE/api/contact" "${DRAIN_FILL_CONN:-64}" "${DRAIN_FILL_SECS:-600}" \
      '{"name":"Bench","email":"d{n}@example.com","message":"Hello from bench_peer"}' > "$OUT/drain-scale-fill-$n.txt"
    queued=$(email_backlog)
    echo "drain-scale $n: filled: $(grep -E '^load (status|http)' "$OUT/drain-scale-fill-$n.txt" | tr '\n' ' ')"
    before=$(sent)
    pids=()
    start=$(date +%s.%N)
    for i in $(seq 1 "$n"); do
      "$BIN/worker" > "$OUT/worker-scale-$n-$i.out" 2> "$OUT/worker-scale-$n-$i.err" & pids+=($!)
    done
    EXTRA_PIDS+=("${pids[@]}")
    deadline=$(( $(date +%s) + ${DRAIN_MAX_SECS:-600} ))
    first="" first_s=0 done_=0
    while :; do
      s=$(( $(sent) - before ))
      [ -z "$first" ] && [ "$s" -gt 0 ] && first=$(date +%s.%N) first_s=$s
      if [ "$s" -ge "$queued" ] && [ "$(email_backlog)" = 0 ] && [ "$(email_inflight)" = 0 ]; then done_=1; break; fi
      [ "$(date +%s)" -ge "$deadline" ] && break
      sleep 0.1
    done
    end=$(date +%s.%N)
    s=$(( $(sent) - before ))
    [ "$done_" = 1 ] || echo "drain-scale $n: gave up after ${DRAIN_MAX_SECS:-600} s: $s of $queued answered, $(email_backlog) queued, $(email_inflight) in flight"
    secs=$(awk -v a="$start" -v b="$end" 'BEGIN {printf "%.2f", b - a}')
    rate[$n]=$(awk -v s="$s" -v a="$start" -v b="$end" 'BEGIN {printf "%.0f", s / (b - a)}')
    rss_all=$(for p in "${pids[@]}"; do awk '/VmHWM/ {printf "%.0f ", $2 / 1024}' "/proc/$p/status" || true; done)
    echo "drain-scale $n: $n worker process(es) drained $queued jobs in $secs s: ${rate[$n]} jobs/s from their start ($(awk -v s="$((s - ${first_s:-0}))" -v a="${first:-$start}" -v b="$end" 'BEGIN {printf "%.0f", s / (b - a)}') jobs/s from the first email answered); email API answered $s; worker peak RSS ${rss_all}MiB; dead letters $(redis-cli scard "$PREFIX:email:dead" 2>/dev/null || echo ?); $(load)"
    kill "${pids[@]}" 2>/dev/null || true
    wait "${pids[@]}" 2>/dev/null || true
  done
  one=${rate[${procs%% *}]}
  for n in $procs; do
    summary+=("$n process(es) ${rate[$n]} jobs/s, x$(awk -v a="${rate[$n]}" -v b="$one" 'BEGIN {printf "%.2f", (b > 0 ? a / b : 0)}')")
  done
  echo "drain-scale: $(printf '%s; ' "${summary[@]}")ratios to ${procs%% *} process(es); $(load)" | tee "$OUT/drain-scale.txt"
fi

# ---- Payments (issue 8) ------------------------------------------------------
psqlq() { psql -h 127.0.0.1 -U postgres -d "${PSQL_DB:-$DB}" -qAt "$@"; }
PAYMENTS=${PAYMENTS:-1000000}
# Signed notifications per wrk run: each request is a first delivery as long as
# the run needs fewer than this many (the script reports wraps otherwise).
WEBHOOK_BODIES=${WEBHOOK_BODIES:-120000}

# Seed: $PAYMENTS PENDING provider_a payments and 10,000 users in the schema the
# api migrated at start (MIGRATE_ON_START defaults to true), one INSERT ... SELECT.
if want payments-seed; then
  echo "### payments-seed: $PAYMENTS payments"
  t0=$(date +%s.%N)
  psqlq -v ON_ERROR_STOP=1 -v n="$PAYMENTS" -f bench/seed_payments.sql
  t1=$(date +%s.%N)
  echo "seeded $(psqlq -c 'select count(*) from payments') payments, $(psqlq -c 'select count(*) from users') users in $(echo "$t1 - $t0" | bc) s; payments table + indexes $(psqlq -c "select pg_size_pretty(pg_total_relation_size('payments'))")"
fi

# Notification bodies for one wrk run: the next $WEBHOOK_BODIES pending order
# ids (never used by an earlier run), signed by bench_peer notify-a.
NEXT_ORDER=1
bodies() { # file
  seq "$NEXT_ORDER" $((NEXT_ORDER + WEBHOOK_BODIES - 1)) \
    | awk '{ printf "ORD-%d-%08X\n", 1764000000000 + $1, $1 }' \
    | "$BIN/examples/bench_peer" notify-a "$PROVIDER_A_KEY" 99000.00 > "$1"
  NEXT_ORDER=$((NEXT_ORDER + WEBHOOK_BODIES))
}
events() { psqlq -c "select count(*) from webhook_events"; }

# Ingestion: verify + lookup among $PAYMENTS rows + record + enqueue, no worker.
webhook_run() { # name, connections
  bodies "$OUT/$1.bodies"
  local before; before=$(events)
  echo "$1: $(load) before the run"
  BODIES="$OUT/$1.bodies" CONN=$2 run "$1" --timeout 10s -s bench/webhook.lua "$BASE"
  grep -E "^answers|^latency ms" "$OUT/$1.txt" || true
  echo "$1: $(( $(events) - before )) events recorded; settlement jobs queued: $(( $(redis-cli llen "$PREFIX:settlement:active") + $(redis-cli zcard "$PREFIX:settlement:scheduled") ))"
  echo "api RSS: $(rss $API_PID); $(load)"
}
want webhook && webhook_run webhook "${WEBHOOK_CONN:-32}"
# 256 connections against the same bounded pool (DB_MAX_CONNECTIONS): the
# answer to overload must be 503 (DEPENDENCY_TIMEOUT_MS), not an unbounded queue.
want webhook256 && webhook_run webhook256 256

# Settlement: ONE worker process settles the backlog the ingestion queued;
# settled webhook_events are counted every 0.5 s.
if want settle; then
  settle_backlog() { echo $(( $(redis-cli llen "$PREFIX:settlement:active") + $(redis-cli zcard "$PREFIX:settlement:scheduled") )); }
  settled() { psqlq -c "select count(*) from webhook_events where settled_at is not null"; }
  total=$(events) queued=$(settle_backlog) before=$(settled)
  echo "### settle: $queued settlement jobs queued for $total events, one worker (WORKER_CONCURRENCY=$WORKER_CONCURRENCY); $(load)"
  start=$(date +%s.%N)
  "$BIN/worker" > "$OUT/worker-settle.out" 2> "$OUT/worker-settle.err" & WORKER_PID=$!
  deadline=$(( $(date +%s) + ${SETTLE_MAX_SECS:-600} ))
  first="" n=$before
  while :; do
    n=$(( $(settled) - before ))
    [ -z "$first" ] && [ "$n" -gt 0 ] && first=$(date +%s.%N) first_n=$n
    [ "$n" -ge "$queued" ] && break
    [ "$(date +%s)" -ge "$deadline" ] && { echo "settle: gave up after ${SETTLE_MAX_SECS:-600} s"; break; }
    sleep 0.5
  done
  end=$(date +%s.%N)
  echo "settled $n of $queued queued events in $(echo "$end - $start" | bc) s from worker start: $(echo "$n / ($end - $start)" | bc) jobs/s ($(echo "($n - ${first_n:-0}) / ($end - ${first:-$start})" | bc) jobs/s from the first settled event); $(load)"
  echo "payments PAID: $(psqlq -c "select count(*) from payments where status = 'PAID'"); events settled with a reason: $(psqlq -c 'select count(*) from webhook_events where settlement_error is not null'); audit rows: $(psqlq -c 'select count(*) from audit_logs'); dead jobs: $(redis-cli scard "$PREFIX:settlement:dead" 2>/dev/null || echo ?)"
  echo "events recorded but never queued (request cancelled between record and push when wrk closed its connections; left to the settlement sweep): $(( total - queued ))"
  echo "worker RSS: $(rss $WORKER_PID)"
fi

# Lookup: the webhook's payment lookup (bench/lookup.sql) by pgbench, prepared
# statements like sqlx, in a copy of the schema with 1,000 payments and in the
# run's database with $PAYMENTS. Each size gets a 3 s warm-up, then
# LOOKUP_REPS (3) alternating runs of LOOKUP_SECS (5) s; the median counts.
if want lookup; then
  echo "### lookup: 1k rows vs $PAYMENTS rows; $(load)"
  psql -h 127.0.0.1 -U postgres -qc "create database ${DB}_1k"
  pg_dump -h 127.0.0.1 -U postgres -s "$DB" | psql -h 127.0.0.1 -U postgres -q -d "${DB}_1k" >/dev/null
  PSQL_DB=${DB}_1k psqlq -v ON_ERROR_STOP=1 -v n=1000 -f bench/seed_payments.sql
  rows_big=$(psqlq -c 'select count(*) from payments')
  echo "shared_buffers $(psqlq -c 'show shared_buffers'); payments with indexes: $(psqlq -c "select pg_size_pretty(pg_total_relation_size('payments'))") at $rows_big rows, $(PSQL_DB=${DB}_1k psqlq -c "select pg_size_pretty(pg_total_relation_size('payments'))") at 1,000"
  lookup_once() { # db, rows, clients, secs -> average latency in ms
    pgbench -h 127.0.0.1 -U postgres -n -M prepared -c "$3" -j $(( $3 < 2 ? 1 : 2 )) -T "$4" \
      -D rows="$2" -f bench/lookup.sql "$1" 2>&1 | tee -a "$OUT/lookup-$3-$2.txt" \
      | awk '/^latency average/ {print $4}'
  }
  median() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
  for c in 1 32; do
    : > "$OUT/lookup-$c-1000.txt"; : > "$OUT/lookup-$c-$rows_big.txt"
    lookup_once "${DB}_1k" 1000 "$c" 3 > /dev/null
    lookup_once "$DB" "$rows_big" "$c" 3 > /dev/null
    small="" big=""
    for _ in $(seq 1 "${LOOKUP_REPS:-3}"); do
      small="$small $(lookup_once "${DB}_1k" 1000 "$c" "${LOOKUP_SECS:-5}")"
      big="$big $(lookup_once "$DB" "$rows_big" "$c" "${LOOKUP_SECS:-5}")"
    done
    ms=$(echo "$small" | median) mb=$(echo "$big" | median)
    echo "lookup c=$c: 1k rows [$small ] ms, $rows_big rows [$big ] ms; medians $ms / $mb ms, ratio $(echo "scale=3; $mb / $ms" | bc)"
  done
fi

# The database's own limit: single-row INSERTs, 32 clients, in the same run.
if want pgbench; then
  echo "### pgbench single-row INSERT; $(load)"
  psqlq -c "create table if not exists bench_insert (id bigserial primary key, order_id text not null, amount bigint not null, created_at timestamptz not null default now())"
  pgbench -h 127.0.0.1 -U postgres -n -c 32 -j 2 -T "${PGBENCH_SECS:-15}" -f bench/insert.sql "$DB" > "$OUT/pgbench.txt" 2>&1
  grep -E '^(latency average|tps)' "$OUT/pgbench.txt"
fi

# Checkout (POST /api/payments, provider_a pointed at bench_peer's instant
# Snap answer). Not in the default list. Each user may check out 5 times per
# 15 min: CHECKOUT_USERS tokens (default 40,000) are minted, the users made
# by a warm-up of POST /api/profile over every token (first sight), then the
# measured run goes round robin over them.
if want checkout; then
  n_users=${CHECKOUT_USERS:-40000}
  "$BIN/examples/bench_peer" tokens HS256 "$BACKEND_JWT_SECRET" "$n_users" > "$OUT/checkout.tokens"
  TOKENS="$OUT/checkout.tokens" wrk -t"$THREADS" -c"${CONN}" -d"${CHECKOUT_WARM:-60s}" -s bench/profile.lua "$BASE/api/profile" > /dev/null
  echo "checkout: $(psqlq -c 'select count(*) from users') users known after the warm-up ($n_users tokens)"
  before=$(curl -s "http://$PEER/count")
  TOKENS="$OUT/checkout.tokens" CONN=${CHECKOUT_CONN:-32} run checkout -s bench/checkout.lua "$BASE"
  grep -E "^answers|^latency ms" "$OUT/checkout.txt" || true
  echo "checkout: fake provider received $(( $(curl -s "http://$PEER/count") - before )) create calls; payments PENDING with a checkout token: $(psqlq -c "select count(*) from payments where checkout_token is not null")"
fi

# ---- AI (issue 9) -------------------------------------------------------------
# bench_peer's fake OpenAI upstream (POST /v1/chat/completions) takes its shape
# from the prompt: "chunks=<n> delay_ms=<ms>" (200 content chunks, the first
# two at once, then one every delay_ms). The measuring clients are bench_peer
# subcommands (ttfb, streams) over reqwest, and wrk for generate. All users are
# FREE users of bench/ai_plans.toml (limits raised, quota still checked).
AI_USERS=${AI_USERS:-1000}
AI_CHUNKS=${AI_CHUNKS:-200}
AI_CHUNK_DELAY_MS=${AI_CHUNK_DELAY_MS:-20}
GEN_CHUNKS=${GEN_CHUNKS:-20}
FAKE=http://$PEER/v1/chat/completions
ai_body() { # chunks, delay_ms -> the api's chat body
  printf '{"messages":[{"role":"user","content":"chunks=%s delay_ms=%s"}]}' "$1" "$2"
}
fake_body() { # chunks, delay_ms -> the same request as the api sends it upstream
  printf '{"model":"gpt-4o-mini","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"chunks=%s delay_ms=%s"}]}' "$1" "$2"
}
# $AI_USERS session tokens; each user is made (first sight) and its quota
# counter seeded by one generate request. With AI_WARM=1 (the default) a
# second generate per user follows, so the api holds every caller's account
# in memory (as it does for anyone who has used it since it started and not
# changed since); AI_WARM=0 leaves each measured chat its caller's first
# since first sight, read from the database.
ai_setup() {
  [ -n "${AI_READY:-}" ] && return
  "$BIN/examples/bench_peer" tokens HS256 "$BACKEND_JWT_SECRET" "$AI_USERS" > "$OUT/ai.tokens"
  local ok pass
  for pass in first second; do
    [ "$pass" = second ] && [ "${AI_WARM:-1}" = 0 ] && break
    ok=$(xargs -P 16 -I{} curl -s -o /dev/null -w '%{http_code}\n' -X POST "$BASE/api/ai/generate" \
      -H 'content-type: application/json' -H "authorization: Bearer {}" \
      -d '{"prompt":"chunks=1 delay_ms=0"}' < "$OUT/ai.tokens" | grep -c '^200$' || true)
    echo "ai: $ok of $AI_USERS users answered a $pass generate request"
  done
  AI_READY=1
}

# Time to first byte: $TTFB_N (200) sequential requests to the fake directly
# and as many through POST /api/ai/chat, taking turns (one keep-alive client
# each, 10 unmeasured warm-ups; each body read to its end). The fake streams
# $AI_CHUNKS chunks $TTFB_DELAY_MS (0) ms apart: with 0 the whole answer comes
# in one burst (the api relays it right after its first byte, while the client
# reads); with 1 or more it is spread out as a model's would be (each request
# then lasts AI_CHUNKS x that long: lower TTFB_N).
# Each first byte is timed twice: as the client read it, and on arrival (the
# kernel's receive stamp, SO_TIMESTAMPNS, which leaves out the client's own
# wait for a core). TTFB_CLIENT=reqwest: the older reqwest client, as read only.
if want ai-ttfb; then
  ai_setup
  d=${TTFB_DELAY_MS:-0}
  echo "### ai-ttfb ($AI_CHUNKS chunks, $d ms apart; api cores ${API_CPUS:-any}, client cores ${CLIENT_CPUS:-any}, client SCHED_FIFO ${CLIENT_RT:-no}); $(load)"
  n=${TTFB_N:-200}
  c0=$(cpu_ms "$API_PID")
  "${CLIENT[@]}" "$BIN/examples/bench_peer" ttfb "$FAKE" - "$n" "$(fake_body "$AI_CHUNKS" "$d")" \
    "$BASE/api/ai/chat" "$OUT/ai.tokens" "$(ai_body "$AI_CHUNKS" "$d")" | tee "$OUT/ai-ttfb.txt" | sed 's/^ttfb difference.*/& (goal: both <= 2 ms)/'
  echo "ai-ttfb: api CPU $(echo "scale=3; ($(cpu_ms "$API_PID") - $c0) / ($n + 10)" | bc) ms per chat"
fi

# Where the first byte's time goes: the same sequential turns against the
# fake, each time with a chat that stops at a later step: no session (401:
# the HTTP hop and the gates), an unknown provider (400: + the token and the
# account: one database query, or none once the api holds the caller's account
# in memory), a provider at a closed port (503: + the Redis limits
# script and a refused connect), then the whole chat (+ the upstream's headers).
if want ai-ttfb-parts; then
  ai_setup
  n=${TTFB_N:-200}
  part() { # name, status, tokens, body
    echo "ai-ttfb-parts: $1"
    TTFB_STATUS=$2 "${CLIENT[@]}" "$BIN/examples/bench_peer" ttfb "$FAKE" - "$n" "$(fake_body "$AI_CHUNKS" 0)" \
      "$BASE/api/ai/chat" "$3" "$4" | tee -a "$OUT/ai-ttfb-parts.txt"
  }
  echo "### ai-ttfb-parts; $(load)"
  : > "$OUT/ai-ttfb-parts.txt"
  part "401, no session" 401 - "$(ai_body 1 0)"
  part "400, unknown provider" 400 "$OUT/ai.tokens" '{"provider":"none","messages":[{"role":"user","content":"hi"}]}'
  part "503, closed port" 503 "$OUT/ai.tokens" '{"provider":"openai_compatible","messages":[{"role":"user","content":"hi"}]}'
  part "200, the whole chat" 200 "$OUT/ai.tokens" "$(ai_body "$AI_CHUNKS" 0)"
fi

# 500 concurrent chats ($AI_STREAMS), each $AI_CHUNKS chunks $AI_CHUNK_DELAY_MS
# ms apart: first the fake directly (its own durations), then through the api.
# The api's RSS is read before, its peak reset (clear_refs 5) and read after
# (VmHWM): (peak - before) / streams is the memory one open stream costs.
if want ai-streams; then
  ai_setup
  ns=${AI_STREAMS:-500}
  echo "### ai-streams: $ns concurrent chats of $AI_CHUNKS chunks, $AI_CHUNK_DELAY_MS ms apart; $(load)"
  "$BIN/examples/bench_peer" streams "$FAKE" - "$ns" "$(fake_body "$AI_CHUNKS" "$AI_CHUNK_DELAY_MS")" | tee "$OUT/ai-streams-direct.txt"
  rest=$(awk '/VmRSS/ {print $2}' "/proc/$API_PID/status")
  # RssFile: the binary's own pages (code, read-only data) mapped in; RssAnon: the heap.
  echo "ai-streams: api before the streams: $(grep -E '^Rss(Anon|File)' "/proc/$API_PID/status" | tr -s ' \t' ' ' | paste -sd ' ')"
  echo 5 > "/proc/$API_PID/clear_refs"
  c0=$(cpu_ms "$API_PID")
  "$BIN/examples/bench_peer" streams "$BASE/api/ai/chat" "$OUT/ai.tokens" "$ns" "$(ai_body "$AI_CHUNKS" "$AI_CHUNK_DELAY_MS")" | tee "$OUT/ai-streams-api.txt"
  peak=$(awk '/VmHWM/ {print $2}' "/proc/$API_PID/status")
  after=$(awk '/VmRSS/ {print $2}' "/proc/$API_PID/status")
  echo "ai-streams: api RSS before $(echo "scale=1; $rest / 1024" | bc) MiB, peak $(echo "scale=1; $peak / 1024" | bc) MiB (goal < 64), after $(echo "scale=1; $after / 1024" | bc) MiB; per stream $(echo "scale=1; ($peak - $rest) / $ns" | bc) KiB"
  echo "ai-streams: api CPU $(echo "scale=2; ($(cpu_ms "$API_PID") - $c0) / $ns" | bc) ms per stream"
fi

# Generate against the instant fake ($GEN_CHUNKS chunks, no delay), wrk over
# the $AI_USERS users' tokens. Goal >= 2,000 req/s.
ai_generate_run() { # name
  TOKENS="$OUT/ai.tokens" AI_PROMPT="chunks=$GEN_CHUNKS delay_ms=0" CONN=${AI_CONN:-$CONN} \
    run "$1" -s bench/ai_generate.lua "$BASE"
  grep -E "^answers|^latency ms" "$OUT/$1.txt" || true
  echo "$1: $(awk '/Requests\/sec/ {print $2}' "$OUT/$1.txt") req/s (goal >= 2,000); api RSS: $(rss $API_PID); $(load)"
}
if want ai-generate; then
  ai_setup
  ai_generate_run ai-generate
fi

# Quota check cost with $AI_USAGE_ROWS (1,000,000) ai_usage rows: generate
# with the table empty, then seeded (the Redis counters present: no sum), then
# with the counters deleted (each user's first request pays the sum once per
# month); and the seeding sum alone by pgbench (1 client, prepared).
if want ai-quota; then
  ai_setup
  rows=${AI_USAGE_ROWS:-1000000}
  echo "### ai-quota: $(psqlq -c 'select count(*) from ai_usage') ai_usage rows before seeding; $(load)"
  ai_generate_run ai-quota-empty
  psqlq -c "set client_min_messages = warning; drop table if exists bench_ai_users; create table bench_ai_users (n int primary key, id uuid not null)"
  python3 -c '
import sys, json, base64
for i, t in enumerate(l for l in sys.stdin if l.strip()):
    p = t.split(".")[1]
    print("%d\t%s" % (i, json.loads(base64.urlsafe_b64decode(p + "=" * (-len(p) % 4)))["sub"]))
' < "$OUT/ai.tokens" | psqlq -c "\\copy bench_ai_users from stdin"
  psqlq -c "delete from bench_ai_users b where not exists (select 1 from users u where u.id = b.id)"
  users=$(psqlq -c 'select count(*) from bench_ai_users')
  t0=$(date +%s.%N)
  psqlq -v ON_ERROR_STOP=1 -v n="$rows" -f bench/ai_seed_usage.sql
  t1=$(date +%s.%N)
  month="created_at >= date_trunc('month', now() at time zone 'UTC') at time zone 'UTC'"
  echo "ai-quota: seeded $(psqlq -c 'select count(*) from ai_usage') rows over $users users in $(echo "$t1 - $t0" | bc) s ($(psqlq -c "select count(*) from ai_usage where $month") this month, $(psqlq -c "select count(*) / $users from ai_usage where $month") per user); ai_usage + indexes $(psqlq -c "select pg_size_pretty(pg_total_relation_size('ai_usage'))")"
  ai_generate_run ai-quota-1m-counters
  pgbench -h 127.0.0.1 -U postgres -n -M prepared -c 1 -T "${QUOTA_SUM_SECS:-5}" -D users="$users" \
    -f bench/ai_sum.sql "$DB" > "$OUT/ai-quota-sum.txt" 2>&1
  psqlq -c "explain (analyze, buffers) select coalesce(sum(input_tokens + output_tokens), 0) from ai_usage where user_id = (select id from bench_ai_users where n = 0) and $month" > "$OUT/ai-quota-explain.txt"
  echo "ai-quota: the seeding sum (absent counter, once per user and month), 1 client: $(awk '/^latency average/ {print $4 " ms average"}' "$OUT/ai-quota-sum.txt"), $(awk '/^tps/ {print $3 " sums/s"}' "$OUT/ai-quota-sum.txt"); plan: $(grep -oE '(Index|Bitmap|Seq)[A-Za-z ]* Scan[a-z ]* on ai_usage[^ ]*' "$OUT/ai-quota-explain.txt" | head -1) ($OUT/ai-quota-explain.txt)"
  redis-cli --scan --pattern "$PREFIX:ai:tokens:*" | xargs -r -n 500 redis-cli del > /dev/null
  ai_generate_run ai-quota-1m-no-counters
  echo "ai-quota: counters re-seeded from the sum during that run: $(redis-cli --scan --pattern "$PREFIX:ai:tokens:*" | wc -l) of $users users"
fi

# ---- Identity (issue 10) -----------------------------------------------------
# $AUTH_USERS (64) accounts signed up through POST /auth/v1/signup (autoconfirm:
# each answer is a session); bench/auth.lua reads "email access refresh" lines.
AUTH_USERS=${AUTH_USERS:-64}
AUTH_PASSWORD=bench-password-0123
export AUTH_PASSWORD
auth_setup() {
  [ -n "${AUTH_READY:-}" ] && return
  AUTH_READY=1
  python3 - "$BASE" "$AUTH_USERS" "$AUTH_PASSWORD" > "$OUT/auth.users" <<'PY'
import concurrent.futures, json, os, sys, urllib.request
base, n, password = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def signup(k):
    body = json.dumps({"email": f"bench{k}@example.com", "password": password}).encode()
    req = urllib.request.Request(base + "/auth/v1/signup", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        s = json.load(r)
    return f'{s["user"]["email"]} {s["access_token"]} {s["refresh_token"]}'
with concurrent.futures.ThreadPoolExecutor(os.cpu_count()) as pool:
    for line in pool.map(signup, range(1, n + 1)):
        print(line)
PY
  echo "auth: $(wc -l < "$OUT/auth.users") accounts signed up; password hash parameters: $(psqlq -c "select split_part(password_hash, '\$', 4) from auth_accounts limit 1") (argon2id)"
}
auth_run() { # name, mode, connections
  USERS="$OUT/auth.users" AUTH_MODE=$2 CONN=$3 run "$1" -s bench/auth.lua "$BASE"
  grep -E "^answers|^latency ms" "$OUT/$1.txt" || true
  echo "$1: api RSS: $(rss $API_PID); $(load)"
}

# Password sign-in: every request verifies an argon2id hash (on the blocking
# pool) and creates a session. Goal >= 50 req/s per core; the machine's cores:
# $(nproc), shared with wrk and PostgreSQL.
if want auth-signin; then
  auth_setup
  auth_run auth-signin signin "${SIGNIN_CONN:-8}"
  echo "auth-signin: $(awk -v c="$(nproc)" '/Requests\/sec/ {printf "%.0f req/s over %d cores = %.1f req/s per core", $2, c, $2 / c}' "$OUT/auth-signin.txt") (goal >= 50 per core)"
fi
# Refresh: each request rotates a refresh token it has not used before
# (bench/auth.lua chains each answer's token into the next request). A
# connection without a token in its thread's pool sends one that must fail, so
# CONN stays below $AUTH_USERS. Goal >= 3,000 req/s.
if want auth-refresh; then
  auth_setup
  auth_run auth-refresh refresh "${REFRESH_CONN:-32}"
fi
# GET /auth/v1/user: verify the ES256 token, check its session still exists,
# load the user. Goal >= 10,000 req/s.
if want auth-user; then
  auth_setup
  auth_run auth-user user "$CONN"
fi
# The floor under auth-user: GET /auth/v1/settings goes through the same
# server, gates and JSON answer but touches neither the database nor a token.
if want auth-settings; then
  run auth-settings "$BASE/auth/v1/settings"
  echo "auth-settings: api RSS: $(rss $API_PID); $(load)"
fi

# ---- Reads (issue 29) ---------------------------------------------------------
# GET /api/me for a warm caller against GET /api/health in the same run: one
# session token (bench_peer tokens HS256, as the profile section's: a user of
# the platform's identity provider, created here at first sight by a profile
# save), warmed by ME_WARM (20) requests, then ME_REPS (3) alternating wrk runs
# of DUR on each route (same CONN), medians compared. Goal: me/health >= 0.5.
if want me; then
  "$BIN/examples/bench_peer" tokens HS256 "$BACKEND_JWT_SECRET" 1 > "$OUT/me.tokens"
  me_token=$(head -1 "$OUT/me.tokens")
  curl -s -o /dev/null -X POST -H "Authorization: Bearer $me_token" -H 'Content-Type: application/json' \
    -d '{"full_name":"Bench User"}' "$BASE/api/profile"
  for _ in $(seq 1 "${ME_WARM:-20}"); do
    code=$(curl -s -o "$OUT/me.json" -w '%{http_code}' -H "Authorization: Bearer $me_token" "$BASE/api/me")
  done
  [ "$code" = 200 ] || { echo "GET /api/me answered $code:" >&2; cat "$OUT/me.json" >&2; exit 1; }
  echo "### me: warm caller $(head -c 300 "$OUT/me.json"); $(load)"
  for i in $(seq 1 "${ME_REPS:-3}"); do
    run "me-health-$i" "$BASE/api/health"
    run "me-me-$i" -H "Authorization: Bearer $me_token" "$BASE/api/me"
  done
  me_med() { for f in "$OUT"/me-"$1"-[0-9]*.txt; do awk '/Requests\/sec/ {print $2}' "$f"; done | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
  h=$(me_med health); m=$(me_med me)
  echo "me: median GET /api/me $m req/s, GET /api/health $h req/s: me/health = $(echo "scale=3; $m / $h" | bc) (goal >= 0.5); non-2xx on /api/me: $(cat "$OUT"/me-me-[0-9]*.txt | awk '/Non-2xx/ {s += $NF} END {print s + 0}')"
  echo "me: api RSS: $(rss $API_PID); $(load)"
fi

# ---- Operations (issue 30) ----------------------------------------------------
# More api processes on the same database and Redis, each on its own port with
# its own extra environment: start_api <port> VAR=value ... (sets EXTRA_PID).
start_api() {
  local port=$1; shift
  env "$@" PORT="$port" "$BIN/api" > "$OUT/api-$port.out" 2> "$OUT/api-$port.err" &
  EXTRA_PID=$!; EXTRA_PIDS+=("$EXTRA_PID")
  for _ in $(seq 1 50); do grep -q listening "$OUT/api-$port.out" 2>/dev/null && break; sleep 0.2; done
  grep -q listening "$OUT/api-$port.out" || { echo "api on $port did not start:" >&2; cat "$OUT/api-$port.err" >&2; exit 1; }
}
stop_api() { kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }
METRICS_TOKEN_BENCH=bench-metrics-token-0123456789abcdef0123

# Metrics on vs off on POST /api/contact: two api processes, the same binary,
# one with METRICS_TOKEN (recorder installed, every request counted and timed,
# scraped every second as Prometheus would), one without; METRICS_REPS (3)
# alternating wrk runs of METRICS_DUR (10s) each, medians compared.
if want metrics; then
  reps=${METRICS_REPS:-3}
  start_api $((API_PORT + 1)); off_pid=$EXTRA_PID
  start_api $((API_PORT + 2)) METRICS_TOKEN=$METRICS_TOKEN_BENCH; on_pid=$EXTRA_PID
  ( while kill -0 "$on_pid" 2>/dev/null; do
      curl -s -o /dev/null -H "Authorization: Bearer $METRICS_TOKEN_BENCH" "http://127.0.0.1:$((API_PORT + 2))/metrics"; sleep 1
    done ) & EXTRA_PIDS+=($!)
  for i in $(seq 1 "$reps"); do
    CPU_PIDS=$off_pid DUR=${METRICS_DUR:-10s} run "contact-metrics-off-$i" -s bench/contact.lua "http://127.0.0.1:$((API_PORT + 1))/api/contact"
    CPU_PIDS=$on_pid DUR=${METRICS_DUR:-10s} run "contact-metrics-on-$i" -s bench/contact.lua "http://127.0.0.1:$((API_PORT + 2))/api/contact"
  done
  med() { for f in "$OUT"/contact-metrics-"$1"-*.txt; do awk '/Requests\/sec/ {print $2}' "$f"; done | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
  off=$(med off); on=$(med on)
  echo "metrics: contact median $off req/s off, $on req/s on: on/off = $(echo "scale=3; $on / $off" | bc) (goal >= 0.95)"
  echo "metrics: api RSS off $(rss $off_pid), on $(rss $on_pid); $(load)"
  curl -s -H "Authorization: Bearer $METRICS_TOKEN_BENCH" "http://127.0.0.1:$((API_PORT + 2))/metrics" > "$OUT/metrics.txt"
  echo "metrics: $(grep -c '^[a-z]' "$OUT/metrics.txt") series exposed; the scrape is in $OUT/metrics.txt"
  stop_api "$off_pid"; stop_api "$on_pid"
fi

# Shedding: POST /api/waitlist from SHED_CONN (1,024) connections against an
# api with the default HTTP_MAX_IN_FLIGHT (or SHED_MAX); as the reference of the
# same run, 32 connections; and the same 1,024 against an api that does not
# shed (HTTP_MAX_IN_FLIGHT=0). These three loads are closed loops whose
# clients ignore Retry-After: a refused connection sends again at once, so the
# api is saturated by refusals and, by Little's law, every answer waits about
# connections / throughput. A fourth load, 1,024 connections against a
# shedding api again, has clients honouring Retry-After (bench_peer load with
# LOAD_RETRY_AFTER=1: after a 503 with `Retry-After: 1` a connection waits
# that second before its next request, as the refusal asks), and a fifth the
# same with jitter (LOAD_JITTER=1: a wait between 1 and 2 s, so the
# connections refused together do not all return in the same instant, as
# clients that back off with jitter behave). Each load runs
# SHED_SECS (15) s and gets a fresh api (so its peak RSS,
# VmHWM, and its histograms are its own run's), with METRICS_TOKEN set.
# Latency two ways: by the client (bench_peer load: send to last byte, split by
# status, including the wait of a request in the socket until the api reads
# it), and by the api itself (http_request_duration_seconds by status: the
# router to the response head), p99 from the histogram's buckets.
hist_p99() { # metrics file, status -> the p99 bucket bound (ms) of POST /api/waitlist
  python3 - "$1" "$2" <<'PY'
import re, sys
b = {}
for line in open(sys.argv[1]):
    m = re.match(r'http_request_duration_seconds_bucket\{(.*)\} (\S+)', line)
    if not m: continue
    labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
    if labels.get('route') == '/api/waitlist' and labels.get('status') == sys.argv[2]:
        b[float('inf') if labels['le'] == '+Inf' else float(labels['le'])] = float(m.group(2))
if not b: print('none'); sys.exit()
total = b[float('inf')]
le = min(k for k, v in b.items() if v >= 0.99 * total)
print(f"<= {le * 1000:g} ms of {int(total)}" if le != float('inf') else f"> 30 s of {int(total)}")
PY
}
shed_run() { # name, port, connections, extra env...
  local name=$1 port=$2 conns=$3; shift 3
  start_api "$port" METRICS_TOKEN=$METRICS_TOKEN_BENCH "$@"
  echo "### $name: $conns connections ($*), clients $([ "${LOAD_RETRY_AFTER:-}" = 1 ] && echo honouring || echo ignoring) Retry-After$([ "${LOAD_JITTER:-}" = 1 ] && echo " with jitter")"
  "$BIN/examples/bench_peer" load "http://127.0.0.1:$port/api/waitlist" "$conns" "${SHED_SECS:-15}" \
    '{"email":"s{n}@example.com","name":"Bench"}' | tee "$OUT/$name.txt"
  curl -s -H "Authorization: Bearer $METRICS_TOKEN_BENCH" "http://127.0.0.1:$port/metrics" > "$OUT/$name.metrics"
  echo "$name: api's own p99: 200 $(hist_p99 "$OUT/$name.metrics" 200); 503 $(hist_p99 "$OUT/$name.metrics" 503)"
  SHED_RSS[$name]=$(rss "$EXTRA_PID")
  echo "$name: api RSS ${SHED_RSS[$name]}; $(load)"
  stop_api "$EXTRA_PID"
}
declare -A SHED_RSS=()
if want shed; then
  # SHED_RUNS picks runs; SHED_ENV adds variables to each shedding api
  # (e.g. SHED_ENV=MALLOC_ARENA_MAX=2); SHED_WARMUP (2) s at the start of
  # every run are not counted (bench_peer's LOAD_WARMUP_SECS).
  export LOAD_WARMUP_SECS=${SHED_WARMUP:-2}
  runs=" ${SHED_RUNS:-shed-32 shed-1024 noshed-1024 shed-1024-retry-after shed-1024-jitter} "
  max=${SHED_MAX:+HTTP_MAX_IN_FLIGHT=$SHED_MAX}
  [[ $runs == *" shed-32 "* ]] && shed_run shed-32 $((API_PORT + 3)) 32 $max ${SHED_ENV:-}
  [[ $runs == *" shed-1024 "* ]] && shed_run shed-1024 $((API_PORT + 4)) "${SHED_CONN:-1024}" $max ${SHED_ENV:-}
  [[ $runs == *" noshed-1024 "* ]] && shed_run noshed-1024 $((API_PORT + 5)) "${SHED_CONN:-1024}" HTTP_MAX_IN_FLIGHT=0 ${SHED_ENV:-}
  [[ $runs == *" shed-1024-retry-after "* ]] && LOAD_RETRY_AFTER=1 shed_run shed-1024-retry-after $((API_PORT + 6)) "${SHED_CONN:-1024}" $max ${SHED_ENV:-}
  [[ $runs == *" shed-1024-jitter "* ]] && LOAD_RETRY_AFTER=1 LOAD_JITTER=1 shed_run shed-1024-jitter $((API_PORT + 7)) "${SHED_CONN:-1024}" $max ${SHED_ENV:-}
  p99() { awk -v s="$2" '$0 ~ "^load status " s ":" {for (i = 1; i <= NF; i++) if ($i == "p99") print $(i + 1)}' "$1"; }
  ref=$(p99 "$OUT/shed-32.txt" 200)
  for r in "shed-1024 ignoring" "shed-1024-retry-after honouring" "shed-1024-jitter honouring-with-jitter"; do
    read -r nm mode <<< "$r"
    [[ $runs == *" $nm "* ]] || continue
    adm=$(p99 "$OUT/$nm.txt" 200)
    echo "shed (clients $mode Retry-After): client-side admitted p99 ${adm:-none} ms at ${SHED_CONN:-1024} connections vs $ref ms at 32: $([ -n "$adm" ] && [ -n "$ref" ] && echo "scale=2; $adm / $ref" | bc) x (goal <= 3); refusals p99 $(p99 "$OUT/$nm.txt" 503) ms (goal < 5); api RSS ${SHED_RSS[$nm]} (goal <= 64 MiB)"
  done
fi

# ---- Renewals and reminders at scale -----------------------------------------
# RENEWAL_SUBS (100,000) users with an email and a paid PRO subscription
# (active, not cancelling) whose period ends are spread evenly over the next
# hour by the database's clock (bench/seed_renewals.sql), then TWO worker
# processes (RENEWAL_WORKERS) started together, with SCHEDULER_TICK_SECS=5
# and the product's defaults otherwise (WORKER_CONCURRENCY and
# DB_MAX_CONNECTIONS unset for them; RENEWAL_WORKER_ENV adds variables), the
# fake email API answering in EMAIL_DELAY_MS (50 ms when this section runs,
# for the whole run: run it alone) and provider_b credentials set so payments
# are ready. The api (started above) only migrated the schema; it stays idle.
# From the workers' start, polled every second (a line every 10 s): seconds
# until every subscription has its open renewal, and until every reminder
# is sent (billing_mails renewal_reminder with sent_at); renewals/s and
# reminders/s end to end. The run stops when both are complete, when nothing
# is left to do (every renewal made, nothing left to remind, no mail in the
# outbox, queued or in flight, no reminder marked sent since the last poll:
# a subscription whose period ended before its reminder gets the past-due
# mail instead and is never reminded, and a mail sent whose mark failed is
# never marked), or at RENEWAL_MAX_SECS (3600, the goal's hour). Each poll
# takes its queries' time on top of the second's sleep (about 2 s under
# load). Workers log at RENEWAL_LOG (the scheduler's ticks and the batches
# at info) to $OUT/worker-renewals-<i>.err; their dead letters are dumped to
# $OUT/renewals-dead.jsonl. Not in the default list; run it alone:
#   bash bench/run.sh renewals
#   RENEWAL_SUBS=10000 bash bench/run.sh renewals
if want renewals; then
  n=${RENEWAL_SUBS:-100000} workers=${RENEWAL_WORKERS:-2}
  rq() { # the figures polled each second, one line: renewals open, reminders queued,
    # reminders sent, reminders left to queue, job_outbox rows, past_due subscriptions, past_due mails
    psqlq -F' ' -c "select (select count(*) from renewals where status = 'open'),
      (select count(*) from billing_mails where kind = 'renewal_reminder'),
      (select count(*) from billing_mails where kind = 'renewal_reminder' and sent_at is not null),
      (select count(*) from renewals where status = 'open' and next_reminder_at is not null),
      (select count(*) from job_outbox),
      (select count(*) from subscriptions where status = 'past_due'),
      (select count(*) from billing_mails where kind = 'past_due')"
  }
  qlen() { echo $(( $(redis-cli llen "$PREFIX:$1:active") + $(redis-cli zcard "$PREFIX:$1:scheduled") )); }
  inflight() { redis-cli --scan --pattern "$PREFIX:$1:inflight*" | xargs -r -n 1 redis-cli scard | awk '{s += $1} END {print s + 0}'; }
  echo "### renewals: $n subscriptions due within the hour, $workers worker processes, fake email API delay ${EMAIL_DELAY_MS} ms; $(load)"
  t0=$(date +%s.%N)
  psqlq -v ON_ERROR_STOP=1 -v n="$n" -f bench/seed_renewals.sql
  t1=$(date +%s.%N)
  echo "renewals: seeded $(psqlq -c "select count(*) from subscriptions where plan = 'PRO' and status = 'active'") subscriptions in $(echo "$t1 - $t0" | bc) s; ends from $(psqlq -c "select min(current_period_end) - now() from subscriptions") to $(psqlq -c "select max(current_period_end) - now() from subscriptions") from now"
  before=$(curl -s "http://$PEER/count")
  : > "$OUT/renewals-progress.txt"
  pids=()
  start=$(date +%s.%N)
  for i in $(seq 1 "$workers"); do
    env -u WORKER_CONCURRENCY -u DB_MAX_CONNECTIONS SCHEDULER_TICK_SECS=5 \
      PAYMENT_PROVIDER=provider_b PROVIDER_B_CLIENT_ID=bench-client-id \
      PROVIDER_B_SECRET_KEY=bench-secret-key-0123456789abcdef PROVIDER_B_BASE_URL=http://$PEER \
      RUST_LOG="${RENEWAL_LOG:-warn,worker::scheduler=info,worker::jobs::billing::renewal=info}" ${RENEWAL_WORKER_ENV:-} \
      "$BIN/worker" > "$OUT/worker-renewals-$i.out" 2> "$OUT/worker-renewals-$i.err" & pids+=($!)
  done
  EXTRA_PIDS+=("${pids[@]}")
  echo "renewals: workers ${pids[*]} started; ends already passed at their start: $(psqlq -c "select count(*) from subscriptions where current_period_end < now()")"
  deadline=$(( ${RENEWAL_MAX_SECS:-3600} ))
  t_renew="" t_remind="" t_queued="" t_last=0 last_sent=0 stop="" shown=0
  while :; do
    sleep 1
    el=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')
    read -r open queued sent left outbox pastdue pdmail <<< "$(rq)"
    [ -z "$t_renew" ] && [ "$open" -ge "$n" ] && t_renew=$el
    [ -z "$t_remind" ] && [ "$sent" -ge "$n" ] && t_remind=$el
    # Every reminder that will ever be queued is queued (the rest ended first).
    [ -z "$t_queued" ] && [ "$open" -ge "$n" ] && [ "$left" = 0 ] && t_queued=$el
    [ "$sent" -gt "$last_sent" ] && t_last=$el
    line="renewals +${el}s: open renewals $open, reminders queued $queued / sent $sent, left to remind $left, job_outbox $outbox, settlement queue $(qlen settlement), email queue $(qlen email), email API answered $(( $(curl -s "http://$PEER/count") - before )), past_due $pastdue (mails $pdmail)"
    if [ $(( ${el%.*} / 10 )) -gt "$shown" ]; then shown=$(( ${el%.*} / 10 )); echo "$line"; fi
    echo "$line" >> "$OUT/renewals-progress.txt"
    if [ -n "$t_renew" ] && [ -n "$t_remind" ]; then stop=complete; break; fi
    # Nothing left: every renewal made, none left to remind, no mail in the
    # outbox, queued or in flight, and no reminder marked sent since the last
    # poll (a mail sent whose mark failed is never marked: not waited for).
    if [ "$open" -ge "$n" ] && [ "$left" = 0 ] && [ "$outbox" = 0 ] && [ "$sent" = "$last_sent" ] \
      && [ "$(qlen email)" = 0 ] && [ "$(inflight email)" = 0 ]; then stop="nothing left to do"; break; fi
    last_sent=$sent
    if [ "${el%.*}" -ge "$deadline" ]; then stop="gave up after $deadline s"; break; fi
  done
  end=$(date +%s.%N)
  echo "$line"
  secs=$(awk -v a="$start" -v b="$end" 'BEGIN {printf "%.1f", b - a}')
  rate() { awk -v n="$1" -v s="$2" 'BEGIN {if (s > 0) printf "%.0f", n / s; else print "-"}'; }
  cpu=$(for p in "${pids[@]}"; do printf '%s ' "$(cpu_ms "$p")"; done)
  rss_all=$(for p in "${pids[@]}"; do awk '/VmHWM/ {printf "%.0f ", $2 / 1024}' "/proc/$p/status" || true; done)
  read -r open queued sent left outbox pastdue pdmail <<< "$(rq)"
  {
    echo "renewals: stopped after $secs s ($stop): $n subscriptions, $workers workers"
    echo "renewals: every open renewal in ${t_renew:-(not reached: $open of $n)} s$([ -n "$t_renew" ] && echo ": $(rate "$n" "$t_renew") renewals/s end to end")"
    if [ -n "$t_remind" ]; then
      echo "renewals: every reminder sent in $t_remind s: $(rate "$n" "$t_remind") reminders/s end to end (goal: both within 3600 s)"
    else
      echo "renewals: every reminder sent: not reached: $sent of $n marked sent, $queued queued ($(( n - queued )) never: their period ended first); every reminder queued by ${t_queued:--} s, the last marked sent at $t_last s: $(rate "$sent" "$t_last") reminders/s end to end (goal: both within 3600 s)"
    fi
    echo "renewals: past_due subscriptions $pastdue (their period ended first; past-due mails $pdmail); email API answered $(( $(curl -s "http://$PEER/count") - before )) (peer /count $(curl -s "http://$PEER/count")); dead letters email $(redis-cli scard "$PREFIX:email:dead"), settlement $(redis-cli scard "$PREFIX:settlement:dead") ($OUT/renewals-dead.jsonl)"
    python3 - "$OUT"/worker-renewals-*.err <<'PY'
import json, sys, collections
ticks = queued = 0; steps = collections.defaultdict(lambda: [0, 0, 0]); levels = collections.Counter()
for f in sys.argv[1:]:
    for line in open(f):
        try: e = json.loads(line)
        except ValueError: continue
        levels[e.get("level")] += 1
        if e.get("message") == "scheduler tick":
            ticks += 1; queued += e.get("renewal_batches", 0)
        elif e.get("message") == "renewal batch":
            s = steps[e["step"]]; s[0] += 1; s[1] += e["rows"]; s[2] += e["changed"]
print("renewals: scheduler ticks that queued batches %d, renewal_batch jobs queued %d; batches that changed rows, by pass: %s; worker log lines WARN %d, ERROR %d"
      % (ticks, queued, ", ".join("%s %d (%d rows, %d changed)" % (k, *v) for k, v in sorted(steps.items())) or "none",
         levels["WARN"], levels["ERROR"]))
PY
    # The commonest warnings and errors, by message (the first 100 characters).
    cat "$OUT"/worker-renewals-*.err | python3 -c '
import json, sys, collections
c = collections.Counter()
for line in sys.stdin:
    try: e = json.loads(line)
    except ValueError: continue
    if e.get("level") in ("WARN", "ERROR"): c[(e["level"], e.get("message", "")[:100])] += 1
for (level, msg), k in c.most_common(8): print("renewals: worker %s x%d: %s" % (level, k, msg))'

    echo "renewals: worker CPU ms ${cpu}, peak RSS ${rss_all}MiB; $(load)"
  } | tee "$OUT/renewals.txt"
  for q in email settlement; do "$BIN/worker" dead-letters "$q" --limit 1000; done > "$OUT/renewals-dead.jsonl" 2>&1 || true
  kill "${pids[@]}" 2>/dev/null || true
  wait "${pids[@]}" 2>/dev/null || true
fi
