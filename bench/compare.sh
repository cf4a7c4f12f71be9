#!/usr/bin/env bash
# Before/after comparison of two builds in one sitting, in turns, so both see
# the same host (load, thermal state, neighbours):
#
#   BEFORE=<dir with api and worker> [AFTER=<dir>] [TURNS=2] bash bench/compare.sh <sections...>
#   BEFORE=/work/base/target/release bash bench/compare.sh health waitlist payments-seed webhook \
#     ai-generate auth-user auth-refresh
#
# Runs `bench/run.sh <sections>` TURNS times per build, the builds taking
# turns (before, after, before, after, ...), with NO_BUILD=1 and BIN set to a
# temporary directory holding links to that build's api and worker and to the
# current bench_peer (PEER_BIN, default $AFTER/examples/bench_peer: the fake
# peers and load clients are the same for both builds). AFTER defaults to
# target/release (not built here: build it first). Every other variable
# run.sh reads (DUR, CONN, API_PORT, PEER_PORT, PAYMENTS, ...) passes through
# to both builds alike.
#
# An older api may refuse the current config/plans.toml (its catalogue
# refuses fields it does not know), so the before runs get the catalogue of
# their own commit as BENCH_PLANS: BEFORE_PLANS=<file> if set, else
# config/plans.toml of BEFORE_REV=<git rev> if set, else <BEFORE>/../../
# config/plans.toml when BEFORE is a checkout's target/<profile> (as
# /work/base/target/release is), else the current one. The AI sections use
# bench/ai_plans.toml for both builds.
#
# Each run's output goes to $OUT (target/bench)/compare-<time>/<build>-<turn>
# (run.sh's OUT) and <build>-<turn>.log; at the end one table per measured run
# (each `run` of run.sh: a wrk run, named as its section for single-run
# sections such as health, waitlist, webhook, ai-generate, auth-user,
# auth-refresh) gives per build and turn the req/s and p99 wrk measured, the
# non-2xx answers, and the api's CPU per request run.sh printed, then each
# build's mean over its turns and after/before ratios. Sections that time no
# wrk run (payments-seed, drain, shed, ...) run but get no table. The webhook
# section needs payments-seed before it in the same list (its notifications
# are for the seeded payments; without them every answer is 404).
set -euo pipefail
cd "$(dirname "$0")/.."
usage() { sed -n '4,5p' "$0" | sed 's/^# *//' >&2; exit 2; }
[ -n "${BEFORE:-}" ] && [ $# -gt 0 ] || usage
AFTER=${AFTER:-target/release}
TURNS=${TURNS:-2}
PEER_BIN=${PEER_BIN:-$AFTER/examples/bench_peer}
for f in "$BEFORE/api" "$BEFORE/worker" "$AFTER/api" "$AFTER/worker" "$PEER_BIN"; do
  [ -x "$f" ] || { echo "compare: $f is missing (build it first)" >&2; exit 1; }
done

ROOT=${OUT:-target/bench}/compare-$(date +%Y%m%d-%H%M%S)
mkdir -p "$ROOT"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
for side in before after; do
  dir=$BEFORE; [ "$side" = after ] && dir=$AFTER
  mkdir -p "$TMP/$side/examples"
  ln -s "$(realpath "$dir/api")" "$TMP/$side/api"
  ln -s "$(realpath "$dir/worker")" "$TMP/$side/worker"
  ln -s "$(realpath "$PEER_BIN")" "$TMP/$side/examples/bench_peer"
done

# The before build's plan catalogue (see above).
if [ -n "${BEFORE_PLANS:-}" ]; then
  before_plans=$(realpath "$BEFORE_PLANS")
elif [ -n "${BEFORE_REV:-}" ]; then
  before_plans=$TMP/before-plans.toml
  git show "$BEFORE_REV:config/plans.toml" > "$before_plans"
elif [ -f "$(realpath "$BEFORE")/../../config/plans.toml" ]; then
  before_plans=$(realpath "$(realpath "$BEFORE")/../../config/plans.toml")
else
  before_plans=$PWD/config/plans.toml
  echo "compare: no catalogue of the before build found (BEFORE_PLANS, BEFORE_REV); using the current config/plans.toml" >&2
fi
echo "compare: before $(realpath "$BEFORE") (plans $before_plans), after $(realpath "$AFTER"), bench_peer $(realpath "$PEER_BIN"); $TURNS turns of: $*; output in $ROOT"

for turn in $(seq 1 "$TURNS"); do
  for side in before after; do
    echo "=== turn $turn: $side; load average $(cut -d' ' -f1-3 /proc/loadavg)"
    plans=()
    [ "$side" = before ] && plans=(BENCH_PLANS="$before_plans")
    env "${plans[@]}" BIN="$TMP/$side" NO_BUILD=1 OUT="$ROOT/$side-$turn" \
      bash bench/run.sh "$@" 2>&1 | tee "$ROOT/$side-$turn.log"
  done
done

# wrk's p99 ("99%  1.23ms") in milliseconds.
to_ms() { awk -v v="$1" 'BEGIN {n = v + 0; u = v; sub(/^[0-9.]+/, "", u); print (u == "us" ? n / 1000 : u == "s" ? n * 1000 : u == "m" ? n * 60000 : n)}'; }
# The measured runs, in the order the first log printed them.
names=$(sed -n 's/^\([A-Za-z0-9_.-]*\): server CPU .*/\1/p' "$ROOT/before-1.log" | awk '!seen[$0]++')
{
  echo
  echo "compare: before = $(realpath "$BEFORE"), after = $(realpath "$AFTER"); $TURNS turns; $*"
  for name in $names; do
    echo "== $name"
    printf '%-7s %4s %12s %10s %8s %14s\n' build turn "req/s" "p99 ms" non-2xx "CPU µs/req"
    for side in before after; do
      for turn in $(seq 1 "$TURNS"); do
        f=$ROOT/$side-$turn/$name.txt
        rps=$(awk '/Requests\/sec/ {print $2}' "$f" 2>/dev/null)
        p99=$(awk '$1 == "99%" {print $2}' "$f" 2>/dev/null)
        bad=$(awk '/Non-2xx/ {s += $NF} END {print s + 0}' "$f" 2>/dev/null)
        cpu=$(sed -n "s/^$name: server CPU \([0-9.]*\) µs.*/\1/p" "$ROOT/$side-$turn.log")
        printf '%-7s %4s %12s %10s %8s %14s\n' "$side" "$turn" "${rps:--}" "$([ -n "$p99" ] && to_ms "$p99" || echo -)" "${bad:--}" "${cpu:--}"
      done
    done
  done | awk '
    # Means per build over its turns, and after/before ratios.
    function flush() {
      if (name == "") return
      for (k = 3; k <= 6; k++) if (k != 5) { mb[k] = nb[k] ? sb[k] / nb[k] : 0; ma[k] = na[k] ? sa[k] / na[k] : 0 }
      printf "%-7s %4s %12.1f %10.3f %8s %14.1f\n", "before", "mean", mb[3], mb[4], "", mb[6]
      printf "%-7s %4s %12.1f %10.3f %8s %14.1f\n", "after", "mean", ma[3], ma[4], "", ma[6]
      printf "after/before: req/s x%s, p99 x%s, CPU per request x%s\n", r(ma[3], mb[3]), r(ma[4], mb[4]), r(ma[6], mb[6])
      delete sb; delete nb; delete sa; delete na
    }
    function r(a, b) { return b > 0 ? sprintf("%.3f", a / b) : "-" }
    /^== / { flush(); name = $2; print ""; print; next }
    /^(before|after) / {
      print
      for (k = 3; k <= 6; k++) if ($k != "-" && k != 5) {
        if ($1 == "before") { sb[k] += $k; nb[k]++ } else { sa[k] += $k; na[k]++ }
      }
      next
    }
    { print }
    END { flush() }'
} | tee "$ROOT/summary.txt"
