#!/usr/bin/env bash
# The night with turns on the card against one domain after another, on this machine, back to back:
#
#     bash scripts/turns_benchmark.sh                      # the cpu preset, searchqa and math, 60 s a proposer call
#     PRESET=smoke WAIT=10 bash scripts/turns_benchmark.sh # a preview in minutes
#
# Both runs use a `command` proposer that waits WAIT seconds, as a coding agent takes its time, then writes what
# scripts/paper_dry_run.py's stand-in agent writes (a sentence added to each candidate's system prompt): the same
# proposals in both runs. TURNS=0 runs the domains one after another, TURNS=1 side by side, holding the card (here
# the CPU) but for their proposers' waits. Each runs run_all.sh in a fresh copy of the repository (results/ left as
# it is), with the same DOMAINS, PRESET and arguments. Prints each wall clock, their ratio (turns / one after
# another) and whether the two tables.md are the same (else their diff). Run it on an idle machine: the cpu preset
# takes over an hour.
set -euo pipefail
cd "$(dirname "$0")/.."
PRESET=${PRESET:-cpu}
WAIT=${WAIT:-60}
DOMAINS=${DOMAINS:-"searchqa math"}
case $WAIT in ''|*[!0-9]*) echo "turns_benchmark.sh: WAIT=$WAIT: write whole seconds" >&2; exit 2 ;; esac
if [ -z "${VIRTUAL_ENV:-}${CONDA_PREFIX:-}" ] && [ -x .venv/bin/python ]; then PATH="$PWD/.venv/bin:$PATH"; fi
TMP=$(mktemp -d /tmp/turns-benchmark.XXXXXX)
echo "turns_benchmark.sh: preset $PRESET, domains [$DOMAINS], proposer wait ${WAIT} s; work in $TMP"

AGENT="sleep $WAIT; $(printf '%q %q' "$(python -c 'from lib.episodes import sandbox; print(sandbox.python())')" \
    "$PWD/scripts/paper_dry_run.py") agent {workdir}"
PROPOSER=(--proposer command --proposer-cmd "$AGENT" --proposer-ro "$PWD/scripts/paper_dry_run.py")

declare -A seconds
for turns in 0 1; do
  repo=$TMP/repo-$turns
  mkdir -p "$repo"
  tar -C . --exclude=./.git --exclude=./.venv --exclude=./results --exclude=./runs --exclude=__pycache__ \
    --exclude=./.pytest_cache -cf - . | tar -C "$repo" -xf -
  t0=$(date +%s.%N)
  rc=0
  (cd "$repo" && TURNS=$turns PRESET=$PRESET DOMAINS=$DOMAINS bash run_all.sh "${PROPOSER[@]}" "$@") \
    > "$TMP/run-$turns.log" 2>&1 || rc=$?
  seconds[$turns]=$(python -c "import sys, time; print(f'{time.time() - float(sys.argv[1]):.1f}')" "$t0")
  echo "TURNS=$turns: ${seconds[$turns]} s, exit $rc (log: $TMP/run-$turns.log)"
  [ "$rc" = 0 ] || { echo "turns_benchmark.sh: run_all.sh failed with TURNS=$turns: $(tail -n 1 "$TMP/run-$turns.log")" >&2; exit 1; }
  cp "$repo/results/$PRESET/tables.md" "$TMP/tables-$turns.md"
done
ratio=$(python -c "import sys; print(f'{float(sys.argv[2]) / float(sys.argv[1]):.3f}')" "${seconds[0]}" "${seconds[1]}")
echo "wall clock with turns / one after another: $ratio (${seconds[1]} s / ${seconds[0]} s)"
if cmp -s "$TMP/tables-0.md" "$TMP/tables-1.md"; then
  echo "tables.md: identical ($TMP/tables-0.md, $TMP/tables-1.md)"
else
  echo "tables.md: DIFFERENT:"
  diff "$TMP/tables-0.md" "$TMP/tables-1.md" || true
  exit 1
fi
