#!/usr/bin/env bash
# Load figures for BENCHMARKS.md: release api + worker against local PostgreSQL
# and Redis, wrk on loopback, a bare poem route measured in the same run.
#
#   bash bench/run.sh            # needs wrk (apt-get install wrk)
#
# Every request loop is bounded (wrk -d); all traffic stays on 127.0.0.1.
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=${DUR:-15s}
CONN=${CONN:-64}
THREADS=${THREADS:-2}
PEER=127.0.0.1:${PEER_PORT:-19999}
API_PORT=${API_PORT:-18080}
DB=bench_$$
PREFIX=bench$$
OUT=${OUT:-target/bench}
mkdir -p "$OUT"

cargo build --release -q -p api -p worker --bins --example bench_peer
BIN=target/release

cleanup() {
  kill "${API_PID:-}" "${WORKER_PID:-}" "${PEER_PID:-}" 2>/dev/null || true
  wait 2>/dev/null || true
  psql -h 127.0.0.1 -U postgres -qc "drop database if exists $DB with (force)" >/dev/null 2>&1 || true
  redis-cli --scan --pattern "$PREFIX:*" | xargs -r -n 500 redis-cli del >/dev/null || true
}
trap cleanup EXIT

psql -h 127.0.0.1 -U postgres -qc "create database $DB"
if curl -s -o /dev/null "http://$PEER/count"; then echo "port of $PEER is taken; set PEER_PORT" >&2; exit 1; fi
"$BIN/examples/bench_peer" "$PEER" > "$OUT/peer.log" 2>&1 & PEER_PID=$!
for _ in $(seq 1 50); do curl -s -o /dev/null "http://$PEER/count" && break; sleep 0.1; done

export DATABASE_URL="postgres://postgres@127.0.0.1:5432/$DB" REDIS_URL=redis://127.0.0.1:6379 \
  QUEUE_PREFIX=$PREFIX TRUST_PROXY=true RATE_LIMIT_PUBLIC_PER_HOUR=100000000 \
  EMAIL_PROVIDER_API_KEY=bench EMAIL_PROVIDER_BASE_URL=http://$PEER EMAIL_FROM=site@example.com \
  PLANS_FILE=config/plans.toml RUST_LOG=${RUST_LOG:-warn} HOST=127.0.0.1 PORT=$API_PORT \
  WORKER_CONCURRENCY=${WORKER_CONCURRENCY:-64} DB_MAX_CONNECTIONS=${DB_MAX_CONNECTIONS:-32}

"$BIN/api" > "$OUT/api.out" 2> "$OUT/api.err" & API_PID=$!
for _ in $(seq 1 50); do grep -q listening "$OUT/api.out" 2>/dev/null && break; sleep 0.2; done
BASE=http://127.0.0.1:$API_PORT

rss() { awk '/VmHWM/ {print $2/1024 " MiB peak"}' "/proc/$1/status"; }
run() { # name, wrk args...
  local name=$1; shift
  echo "### $name"
  wrk -t"$THREADS" -c"$CONN" -d"$DUR" --latency "$@" | tee "$OUT/$name.txt" | grep -E "Requests/sec|Latency|99%|Non-2xx|Socket errors" || true
}

run bare http://$PEER/bare
run health "$BASE/api/health"
run contact -s bench/contact.lua "$BASE/api/contact"
run waitlist -s bench/waitlist.lua "$BASE/api/waitlist"
echo "api RSS: $(rss $API_PID)"

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
