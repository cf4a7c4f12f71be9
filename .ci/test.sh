#!/usr/bin/env bash
# The whole test suite on a fresh machine: makes sure PostgreSQL and Redis run
# (starting them, and installing them with apt-get when missing and we are root)
# and that s3s-fs (an S3 server) and chromium (the browser test's, apt-get)
# are installed (when missing),
# builds the binaries, then runs every test. The SMTP sink and the fake
# provider APIs are started by the tests themselves, one per test.
#
#   bash .ci/test.sh            # everything
#   bash .ci/test.sh contact    # only tests whose name matches
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '\n==> %s\n' "$*"; }

have() { command -v "$1" >/dev/null 2>&1; }

apt_install() {
  if [ "$(id -u)" = 0 ] && have apt-get; then
    log "installing $*"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null || true
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
  else
    echo "missing $* and cannot install it (need root and apt-get)" >&2
    return 1
  fi
}

ensure_postgres() {
  if pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then return 0; fi
  if ! ls /etc/postgresql/*/main >/dev/null 2>&1; then apt_install postgresql; fi
  local ver; ver=$(ls /etc/postgresql | sort -V | tail -n 1)
  log "starting PostgreSQL $ver"
  pg_ctlcluster --skip-systemctl-redirect "$ver" main start || true
  for _ in $(seq 1 30); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 1; done
  pg_isready -h 127.0.0.1 -p 5432
  # The tests connect as postgres without a password over TCP.
  if ! psql -h 127.0.0.1 -U postgres -c 'select 1' >/dev/null 2>&1; then
    local hba; hba=$(ls /etc/postgresql/"$ver"/main/pg_hba.conf)
    sed -i 's/^\(host\s\+all\s\+all\s\+127.0.0.1\/32\s\+\).*/\1trust/; s/^\(host\s\+all\s\+all\s\+::1\/128\s\+\).*/\1trust/' "$hba"
    pg_ctlcluster --skip-systemctl-redirect "$ver" main reload
  fi
}

# The suite runs TEST_THREADS (8) tests at once, each with its own apis,
# workers and pools on one PostgreSQL; at PostgreSQL's default of 100
# connections a busy moment runs out ("too many clients") and a process
# starting then fails to migrate. Raise it (a restart) when we may.
ensure_postgres_connections() {
  local want=300 have ver
  have=$(psql -h 127.0.0.1 -U postgres -Atc 'show max_connections' 2>/dev/null || echo 0)
  [ "${have:-0}" -ge "$want" ] && return 0
  if [ "$(id -u)" = 0 ] && have pg_ctlcluster && ls /etc/postgresql/*/main >/dev/null 2>&1; then
    ver=$(ls /etc/postgresql | sort -V | tail -n 1)
    log "raising PostgreSQL max_connections from $have to $want (restart)"
    psql -h 127.0.0.1 -U postgres -qc "ALTER SYSTEM SET max_connections = $want"
    pg_ctlcluster --skip-systemctl-redirect "$ver" main restart
    for _ in $(seq 1 30); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 1; done
    pg_isready -h 127.0.0.1 -p 5432
  else
    echo "PostgreSQL max_connections is $have (< $want) and cannot be raised here; busy moments may fail" >&2
  fi
}

ensure_redis() {
  # The TLS tests start their own redis-server (Debian's is built with TLS),
  # even when a Redis already answers on 6379.
  have redis-server || apt_install redis-server
  if have redis-cli && redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then return 0; fi
  log "starting Redis"
  mkdir -p /var/lib/redis /var/log/redis 2>/dev/null || true
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir "${TMPDIR:-/tmp}" --logfile "${TMPDIR:-/tmp}/redis-test.log"
  for _ in $(seq 1 30); do redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 && break; sleep 0.5; done
  redis-cli -h 127.0.0.1 -p 6379 ping
}

# A real S3 server that checks SigV4 signatures, for the object-store tests.
ensure_s3s_fs() {
  export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
  if have s3s-fs; then return 0; fi
  log "installing s3s-fs (S3 server for the storage tests)"
  # A debug build compiles in about half the time; the tests do not need its speed.
  cargo install --locked --quiet --debug s3s-fs@0.14.1 --features binary
}

# The metrics test reads /metrics with Prometheus' own text-format parser
# (prometheus_client from PyPI, in a venv); PROMETHEUS_PYTHON names its python.
ensure_prometheus_parser() {
  local version=0.26.0
  local venv="${XDG_CACHE_HOME:-$HOME/.cache}/prometheus-client-venv-$version"
  if ! "$venv/bin/python" -c "import prometheus_client" >/dev/null 2>&1; then
    log "installing prometheus_client $version"
    python3 -m venv "$venv" >/dev/null 2>&1 || {
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
      python3 -m venv "$venv"
    }
    "$venv/bin/pip" install --quiet --disable-pip-version-check "prometheus_client==$version"
  fi
  export PROMETHEUS_PYTHON="$venv/bin/python"
}

# The browser test drives Debian's chromium (puppeteer-core downloads no browser).
ensure_chromium() {
  if have chromium; then return 0; fi
  apt_install chromium
}

ensure_postgres
ensure_postgres_connections
ensure_redis
ensure_s3s_fs
ensure_chromium
ensure_prometheus_parser
# Every PostgreSQL test (model rules, migrations, black-box) makes its scratch
# databases from this admin URL and fails, never skips, when it is unreachable.
export TEST_DATABASE_ADMIN_URL="${TEST_DATABASE_ADMIN_URL:-postgres://postgres@127.0.0.1:5432/postgres}"

log "building"
cargo build --workspace --bins --quiet

log "testing"
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --no-fail-fast --test-threads "${TEST_THREADS:-8}" "$@"
else
  cargo test --workspace --no-fail-fast -- --test-threads "${TEST_THREADS:-8}" "$@"
fi

# Contract fuzzing of the running api (only on a full run, not a filtered one).
if [ "$#" -eq 0 ]; then
  log "schemathesis"
  bash .ci/schemathesis.sh
fi
