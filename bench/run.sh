#!/usr/bin/env bash
# Load figures for BENCHMARKS.md: release api + worker against local PostgreSQL
# and Redis, wrk on loopback, a bare poem route measured in the same run.
#
#   bash bench/run.sh            # everything; needs wrk (apt-get install wrk)
#   bash bench/run.sh profile jwks upload   # only these sections
#
# Sections: bare health contact waitlist drain (issue 2), profile jwks upload verify (issue 3).
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
SECTIONS=${*:-bare health contact waitlist drain profile jwks upload verify}
want() { [[ " $SECTIONS " == *" $1 "* ]]; }

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
  WORKER_CONCURRENCY=${WORKER_CONCURRENCY:-64} DB_MAX_CONNECTIONS=${DB_MAX_CONNECTIONS:-32} \
  NEXT_PUBLIC_BACKEND_URL=http://$PEER NEXT_PUBLIC_BACKEND_PUBLISHABLE_KEY=pk_bench \
  BACKEND_JWT_SECRET=bench-jwt-secret-0123456789abcdef0123 BACKEND_SERVICE_ROLE_KEY=bench-service-role-0123456789abcdef0123 \
  STORAGE_URL=file://$PWD/$OUT/storage

"$BIN/api" > "$OUT/api.out" 2> "$OUT/api.err" & API_PID=$!
for _ in $(seq 1 50); do grep -q listening "$OUT/api.out" 2>/dev/null && break; sleep 0.2; done
BASE=http://127.0.0.1:$API_PORT

rss() { awk '/VmHWM/ {print $2/1024 " MiB peak"}' "/proc/$1/status"; }
run() { # name, wrk args...
  local name=$1; shift
  echo "### $name"
  wrk -t"$THREADS" -c"$CONN" -d"$DUR" --latency "$@" | tee "$OUT/$name.txt" | grep -E "Requests/sec|Latency|99%|Non-2xx|Socket errors" || true
}

want bare && run bare http://$PEER/bare
want health && run health "$BASE/api/health"
want contact && run contact -s bench/contact.lua "$BASE/api/contact"
want waitlist && run waitlist -s bench/waitlist.lua "$BASE/api/waitlist"

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

want drain || exit 0
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
