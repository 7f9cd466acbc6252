#!/usr/bin/env bash
# Every domain x method, then the report:   bash run_all.sh
# Preset: `gpu` when a CUDA GPU is visible, else `cpu`; PRESET=... overrides (PRESET=paper: the official budgets,
# GPU-days); SMOKE=1 means `smoke`.
# DOMAINS="searchqa math" narrows the domains; ADAPTIVE=0|1 leaves out or adds the adaptive WHALE runs (default:
# 1, except 0 under cpu, to keep it within an hour; never on chess, as in the paper). Finished runs are skipped,
# killed ones resume.
set -euo pipefail
cd "$(dirname "$0")"
# the environment install.sh filled: an active venv or conda env, else .venv/ (no activation needed)
if [ -z "${VIRTUAL_ENV:-}${CONDA_PREFIX:-}" ] && [ -x .venv/bin/python ]; then PATH="$PWD/.venv/bin:$PATH"; fi
python -c "import torch" 2> /dev/null || { echo "run_all.sh: no environment with torch here: run bash install.sh first" >&2; exit 1; }

if [ "${SMOKE:-0}" = "1" ]; then
  PRESET=smoke
elif [ -z "${PRESET:-}" ]; then
  if python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    PRESET=gpu
  else
    PRESET=cpu
  fi
fi
# cpu: chess is left out by default (SmolLM2-135M solves none; its long multi-turn prompts cost ~8x a searchqa episode)
if [ "$PRESET" = cpu ]; then DOMAINS=${DOMAINS:-"searchqa math"}; else DOMAINS=${DOMAINS:-"searchqa math chess"}; fi
if [ "$PRESET" = cpu ]; then ADAPTIVE=${ADAPTIVE:-0}; else ADAPTIVE=${ADAPTIVE:-1}; fi
case $ADAPTIVE in 0|1) ;; *) echo "run_all.sh: ADAPTIVE=$ADAPTIVE: write ADAPTIVE=0 or ADAPTIVE=1" >&2; exit 2 ;; esac
METHODS="harness-only weight-only stagewise fast-slow whale"
case $PRESET in  # measured on the 2-core machine with the default DOMAINS
  smoke) eta="about 2 min" ;;  # fresh clone, 2026-11-30: 1 min 20 s
  cpu)   eta="about 36 min" ;;  # fresh clone, 2026-11-30, idle: 36 min 4 s (temperature 0.6)
  gpu)   eta="about 12 h on one 80 GB card (estimated: python scripts/memory_plan.py)" ;;
  paper) eta="GPU-days: hours per run (README: the paper and gpu presets on one GPU)" ;;
  *) echo "run_all.sh: unknown PRESET=$PRESET: choose smoke, cpu, gpu or paper" >&2; exit 2 ;;
esac
n=$(( $(wc -w <<< "$DOMAINS") * $(wc -w <<< "$METHODS") + ADAPTIVE * $(wc -w <<< "${DOMAINS/chess/}") ))
echo "run_all.sh: preset $PRESET, domains [$DOMAINS], methods [$METHODS]$([ "$ADAPTIVE" = 1 ] && echo " + adaptive WHALE")"
echo "run_all.sh: $n runs; with the default domains and none done yet, $eta in all; results in results/$PRESET/"

needs_run() {  # needs_run DOMAIN RUN_DIR: false (and says so) when the run is finished
  if [ -f "results/$PRESET/$1/$2/summary.json" ]; then
    echo "== $1 / $2: done, skipped" >&2
    return 1
  fi
}

for domain in $DOMAINS; do
  todo=()
  for method in $METHODS; do
    if needs_run "$domain" "$method"; then todo+=("$method"); fi
  done
  # the methods of a domain share one process: the imports, and the weight phases and evaluations they have
  # in common, are paid once; a vllm engine holds the GPU until its process ends, so the gpu and paper presets
  # run one method per process
  if [ ${#todo[@]} -gt 0 ] && [[ "$PRESET" = gpu || "$PRESET" = paper ]]; then
    for method in "${todo[@]}"; do python whale.py --preset "$PRESET" --domain "$domain" --method "$method"; done
  elif [ ${#todo[@]} -gt 0 ]; then
    python whale.py --preset "$PRESET" --domain "$domain" --method "${todo[@]}"
  fi
  if [ "$ADAPTIVE" = 1 ] && [ "$domain" != chess ] && needs_run "$domain" whale-adaptive; then
    python whale.py --preset "$PRESET" --domain "$domain" --method whale --schedule adaptive
  fi
done
python report.py --preset "$PRESET"
