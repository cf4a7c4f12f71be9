#!/usr/bin/env bash
# Contract fuzzing: runs schemathesis 4.x (`--checks all`, coverage and
# fuzzing phases) against the api (debug build), in two passes, each on a
# fresh PostgreSQL database and Redis prefix. Fails on any finding; always
# stops the api and drops the databases.
#
# 1. Every feature configured with an external auth platform, a session token
#    of an admin user; every operation (`/auth/v1` answers 404 there).
# 2. The built-in identity provider on (`AUTH_PROVIDER=builtin`, autoconfirm,
#    the per-IP auth limits and the mail interval lifted), only the `/auth/v1`
#    operations, with the bearer token of a signed-up user; `PUT /user` and
#    `logout` (which alter or end sessions) each run apart, on a user and
#    session of their own.
#
#   bash .ci/schemathesis.sh                 # a random seed (printed)
#   SEED=1234 bash .ci/schemathesis.sh       # replay a run
#   MAX_EXAMPLES=300 bash .ci/schemathesis.sh # more cases per operation (default 100)
#   AUTH_MAX_EXAMPLES=50 bash .ci/schemathesis.sh # pass 2 (default 100)
#
# Needs: python3 (with venv), PostgreSQL on 127.0.0.1:5432 (user postgres,
# trust), Redis on 127.0.0.1:6379, and `cargo build --workspace --bins` done.
set -euo pipefail
cd "$(dirname "$0")/.."

ST_VERSION=4.32.5
VENV="${SCHEMATHESIS_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/schemathesis-venv-$ST_VERSION}"
SEED="${SEED:-$(( (RANDOM << 15) | RANDOM ))}"
MAX_EXAMPLES="${MAX_EXAMPLES:-100}"
AUTH_MAX_EXAMPLES="${AUTH_MAX_EXAMPLES:-100}"
API_BIN="${API_BIN:-target/debug/api}"
PGURL_ADMIN="${PGURL_ADMIN:-postgres://postgres@127.0.0.1:5432/postgres}"
REDIS_URL="${REDIS_URL:-redis://127.0.0.1:6379}"

log() { printf '\n==> %s\n' "$*"; }

if [ ! -x "$VENV/bin/schemathesis" ]; then
  log "installing schemathesis $ST_VERSION into $VENV"
  rm -rf "$VENV"
  if ! python3 -m venv "$VENV" >/dev/null 2>&1; then
    # Debian splits venv out of python3.
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null || true
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
      rm -rf "$VENV"
      python3 -m venv "$VENV"
    else
      echo "python3 -m venv failed: install python3-venv" >&2
      exit 1
    fi
  fi
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "schemathesis==$ST_VERSION"
fi
[ -x "$API_BIN" ] || { echo "$API_BIN missing: run cargo build --workspace --bins" >&2; exit 1; }

work=$(mktemp -d)
run_id="st_$(date +%s)_$$"
dbs=()
api_pid=""
fake_pid=""
fake_ai_pid=""
stop_api() {
  if [ -n "$api_pid" ]; then kill "$api_pid" 2>/dev/null || true; wait "$api_pid" 2>/dev/null || true; fi
  api_pid=""
}
cleanup() {
  stop_api
  if [ -n "$fake_pid" ]; then kill "$fake_pid" 2>/dev/null || true; wait "$fake_pid" 2>/dev/null || true; fi
  if [ -n "$fake_ai_pid" ]; then kill "$fake_ai_pid" 2>/dev/null || true; wait "$fake_ai_pid" 2>/dev/null || true; fi
  for d in "${dbs[@]}"; do
    psql -q "$PGURL_ADMIN" -c "DROP DATABASE IF EXISTS $d WITH (FORCE)" >/dev/null 2>&1 || true
    if command -v redis-cli >/dev/null 2>&1; then
      redis-cli -u "$REDIS_URL" --scan --pattern "st-$d:*" | xargs -r redis-cli -u "$REDIS_URL" del >/dev/null || true
    fi
  done
  rm -rf "$work"
}
trap cleanup EXIT

# A fresh database, Redis prefix and data directory for pass `$1`.
fresh_store() {
  local db="${run_id}_$1"
  psql -q "$PGURL_ADMIN" -c "CREATE DATABASE $db" >/dev/null
  dbs+=("$db")
  export DATABASE_URL="postgres://postgres@127.0.0.1:5432/$db" QUEUE_PREFIX="st-$db"
  export DATA_DIR="$work/data-$1"
}

# Starts "$API_BIN" with the current environment; sets api_pid and url.
start_api() {
  "$API_BIN" >"$work/api.out" 2>"$work/api.err" &
  api_pid=$!
  url=""
  for _ in $(seq 1 150); do
    url=$(sed -n 's/^api listening on \(http:[^ ]*\).*/\1/p' "$work/api.out" | head -n 1)
    [ -n "$url" ] && break
    kill -0 "$api_pid" 2>/dev/null || { cat "$work/api.err" >&2; echo "api exited" >&2; exit 1; }
    sleep 0.2
  done
  [ -n "$url" ] || { cat "$work/api.err" >&2; echo "api did not start" >&2; exit 1; }
}

# `schemathesis run` against $url with a bearer token ($1), a label for the
# summary ($2), the examples per operation ($3) and more options ($4…);
# prints the generated cases and exits on a finding.
summary=()
fuzz() {
  local token=$1 label=$2 examples=$3 status cases started
  shift 3
  started=$(date +%s)
  log "schemathesis $ST_VERSION, $label, against $url (seed $SEED, max $examples examples per operation)"
  set +e
  "$VENV/bin/schemathesis" run "$url/api/openapi.json" \
    --url "$url" \
    -H "Authorization: Bearer $token" \
    --checks all \
    --phases examples,coverage,fuzzing \
    --max-examples "$examples" \
    --seed "$SEED" \
    "$@" \
    --no-color 2>&1 | tee "$work/st.log"
  status=${PIPESTATUS[0]}
  set -e
  cases=$(grep -Eo '[0-9]+ generated' "$work/st.log" | tail -n 1 | grep -Eo '[0-9]+' || echo "?")
  echo "schemathesis ($label): $cases generated cases in $(( $(date +%s) - started )) s, seed $SEED, exit status $status"
  summary+=("$label: $cases cases in $(( $(date +%s) - started )) s")
  if [ "$status" -ne 0 ]; then
    echo "--- api stderr (tail) ---"; tail -n 40 "$work/api.err"
    exit "$status"
  fi
}

# Pass 1: every feature configured; the secrets are throwaway values of this run.
fresh_store all
export HOST=127.0.0.1 PORT=0 LOG_FORMAT=json RUST_LOG=warn
export REDIS_URL PLANS_FILE="$PWD/config/plans.toml" MIGRATE_ON_START=true
export RATE_LIMIT_PUBLIC_PER_HOUR=100000000
export BACKEND_JWT_SECRET="schemathesis-jwt-secret-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')"
export BACKEND_SERVICE_ROLE_KEY="schemathesis-service-role-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')"
export NEXT_PUBLIC_BACKEND_URL=http://127.0.0.1:9 NEXT_PUBLIC_BACKEND_PUBLISHABLE_KEY=pk_schemathesis
export SMTP_URL=smtp://127.0.0.1:9 EMAIL_FROM=site@example.com
export PAYMENT_PROVIDER=provider_b PROVIDER_B_CLIENT_ID=client-st PROVIDER_B_SECRET_KEY=secret-st
export PROVIDER_A_SERVER_KEY=server-key-st
# POST /api/payments calls the provider: a local fake answers the documented
# success shapes (.ci/fake_provider.py), so checkout answers 200, not 502.
python3 .ci/fake_provider.py >"$work/fake.out" 2>"$work/fake.err" &
fake_pid=$!
fake_url=""
for _ in $(seq 1 50); do
  fake_url=$(sed -n 's/^listening on \(http:[^ ]*\).*/\1/p' "$work/fake.out" | head -n 1)
  [ -n "$fake_url" ] && break
  sleep 0.1
done
[ -n "$fake_url" ] || { cat "$work/fake.err" >&2; echo "fake provider did not start" >&2; exit 1; }
export PROVIDER_A_BASE_URL="$fake_url" PROVIDER_B_BASE_URL="$fake_url"
export OPENAI_API_KEY=sk-schemathesis
# A fake AI provider (no outbound call) for all three providers: a short
# documented SSE answer with usage (Anthropic's events on `/v1/messages`,
# OpenAI Chat Completions chunks elsewhere).
cat >"$work/fake_openai.py" <<'PY'
import http.server, socketserver
OPENAI = (b'data: {"choices":[{"index":0,"delta":{"content":"ok"},"finish_reason":"stop"}]}\n\n'
          b'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1}}\n\ndata: [DONE]\n\n')
ANTHROPIC = (b'event: message_start\ndata: {"type":"message_start","message":{"usage":{"input_tokens":1,"output_tokens":1}}}\n\n'
             b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"ok"}}\n\n'
             b'event: message_stop\ndata: {"type":"message_stop"}\n\n')
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length") or 0))
        BODY = ANTHROPIC if self.path.endswith("/messages") else OPENAI
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("content-length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)
    def log_message(self, *a):
        pass
class S(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
s = S(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
PY
python3 "$work/fake_openai.py" >"$work/fake_openai.port" &
fake_ai_pid=$!
for _ in $(seq 1 50); do [ -s "$work/fake_openai.port" ] && break; sleep 0.1; done
fake_ai="http://127.0.0.1:$(cat "$work/fake_openai.port")"
export OPENAI_BASE_URL="$fake_ai/v1" OPENAI_COMPATIBLE_BASE_URL="$fake_ai/v1"
export ANTHROPIC_BASE_URL="$fake_ai" ANTHROPIC_API_KEY=sk-ant-schemathesis
# The session user is an admin, so the admin route is exercised past its 403.
user=$(python3 -c 'import uuid; print(uuid.uuid4())')
export ADMIN_USER_IDS="$user"

start_api
token=$("$API_BIN" token --sub "$user" --email "st-$user@example.com" --ttl-secs 3600)
fuzz "$token" "pass 1 (every operation)" "$MAX_EXAMPLES"
stop_api

# Pass 2: the built-in identity provider, only `/auth/v1`. Sign-ups are
# confirmed at once (the fuzzer's users need no mailbox), the per-IP limits
# (every request comes from 127.0.0.1) and the per-user mail interval are
# lifted so the operations answer past their 429s. Mails are only queued: no
# worker runs, so nothing is sent and the jobs go with the Redis prefix.
fresh_store idp
export AUTH_PROVIDER=builtin AUTH_AUTOCONFIRM=true AUTH_MAIL_INTERVAL_SECS=0
export AUTH_RATE_LIMIT_PER_5MIN=100000000 AUTH_RATE_LIMIT_REFRESH_PER_5MIN=100000000
# Both OAuth providers configured, so `/authorize` answers its 302; their
# endpoints are a closed local port (only a callback with a stored state, which
# the fuzzer never has, would call them).
export OAUTH_GITHUB_CLIENT_ID=st-github OAUTH_GITHUB_CLIENT_SECRET=st-github-secret
export OAUTH_GITHUB_BASE_URL=http://127.0.0.1:9 OAUTH_GITHUB_API_URL=http://127.0.0.1:9
export OAUTH_GOOGLE_CLIENT_ID=st-google OAUTH_GOOGLE_CLIENT_SECRET=st-google-secret
export OAUTH_GOOGLE_AUTH_URL=http://127.0.0.1:9/auth OAUTH_GOOGLE_TOKEN_URL=http://127.0.0.1:9/token
export OAUTH_GOOGLE_USERINFO_URL=http://127.0.0.1:9/userinfo
start_api
# A confirmed user of the provider and its session: `POST /signup` answers a
# session under autoconfirm.
st_password="st-$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')"
session() {
  curl -fsS -X POST "$url/auth/v1/signup" -H 'content-type: application/json' \
    -d "{\"email\":\"$1@example.com\",\"password\":\"$st_password\"}" |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["access_token"])'
}
token=$(session st-idp)
fuzz "$token" "pass 2 (/auth/v1)" "$AUTH_MAX_EXAMPLES" --include-path-regex '^/auth/v1/' \
  --exclude-operation-id authUpdateUser --exclude-operation-id authLogout
# A new password ends the account's other sessions, and sign-out ends them
# all: each runs apart, on a user and session of its own.
token=$(session st-idp-update)
fuzz "$token" "pass 2 (PUT /auth/v1/user)" "$AUTH_MAX_EXAMPLES" --include-operation-id authUpdateUser
token=$(session st-idp-logout)
fuzz "$token" "pass 2 (POST /auth/v1/logout)" "$AUTH_MAX_EXAMPLES" --include-operation-id authLogout
stop_api
log "schemathesis: no finding (seed $SEED): $(IFS=';'; echo "${summary[*]}")"
