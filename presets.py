"""The presets: named bundles of whale.py's defaults (any flag given on the command line wins), and
the paper and gpu presets' per-domain settings. Why each value is what it is: docs/cpu-run/README.md
(cpu), docs/protocol.md and docs/fidelity.md (paper), docs/gpu.md (gpu).

    python plan.py --domain math --preset cpu      # what a preset spends, no model loaded
    args = parse_with_preset(parser, argv)         # every command's parse: the preset's defaults, any flag given wins
"""
import argparse
import os
import shlex
import sys
import time

from lib.methods import METHODS, table_names

SAMPLE_S = 0.5  # how long choose_threads watches the cores


# -----------------------------------------------------------------------------
# the cpu preset's torch threads (--threads auto): what the machine is doing when the process starts


def cpu_threads(cores, busy):
    """One torch thread for each core this process may use that no other process keeps busy, at least one: on an
    idle machine every core speeds the forwards up, while an intra-op thread on a core another process holds spins
    against it (the measurements: README, the commands table). busy: cores' worth of other processes' time."""
    return max(1, cores - round(busy))


def cpu_times(cores, stat="/proc/stat"):
    """(busy, total) clock ticks the given cores have spent since boot (/proc/stat's cpuN lines; idle and iowait
    are the idle time)."""
    busy = total = 0
    for line in open(stat):
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cores:
            ticks = [int(f) for f in fields[:8]]  # user nice system idle iowait irq softirq steal (guest is in user)
            busy, total = busy + sum(ticks) - ticks[3] - ticks[4], total + sum(ticks)
    return busy, total


def busy_cores(before, after, own_ticks, cores):
    """How many of `cores` cores other processes kept busy between two cpu_times readings: the cores' busy ticks
    less this process's own (own_ticks), over the ticks that passed on one core."""
    elapsed = (after[1] - before[1]) / cores
    return max(0.0, (after[0] - before[0] - own_ticks) / elapsed) if elapsed > 0 else 0.0


def choose_threads():
    """--threads auto: (threads, why in words) from the cores this process may use (os.sched_getaffinity: a
    container's or taskset's share, not the machine's) and how busy they are over SAMPLE_S seconds."""
    if not hasattr(os, "sched_getaffinity") or not os.path.exists("/proc/stat"):
        return 1, "one: this system does not say which cores are free"
    cores = os.sched_getaffinity(0)
    own = lambda: sum(os.times()[:2]) * os.sysconf("SC_CLK_TCK")  # noqa: E731: this process's CPU time, in ticks
    before, own_before = cpu_times(cores), own()
    time.sleep(SAMPLE_S)
    busy = busy_cores(before, cpu_times(cores), own() - own_before, len(cores))
    threads = cpu_threads(len(cores), busy)
    return threads, f"{len(cores)} cores this process may use, {busy:.1f} of them busy with other processes"


# Named bundles of defaults; any flag given on the command line wins. I (--harness-iterations)
# counts the re-scoring of the incoming harness, so a harness phase makes I - 1 proposer rounds.
# smoke only checks the wiring (all runs in minutes); its math runs train (SMOKE below).
# cpu: SmolLM2-135M in the paper's proportions: 8 RSFT steps (64 train prompts, 8 a step, G = 4) in 3
# weight phases of 3, 3, 2 (E = 0.375), a harness phase of one round (I = 2, M = 3 on 24 harness
# tasks) between each two, so harness-only gets 3 rounds; test mean@4 on 50 tasks before training
# and after the last phase only (test_evals ends), a seeded sample that leaves out the first 50 of
# each test split. Its h0s (CPU below) are the bundled ones with the fewest knob changes under which
# the base model earns a small training reward, so both axes can move from the first phase, as in
# the paper. Calibrated on the train and harness splits only; each value's reason and measurement:
# docs/cpu-run/README.md.
# paper is the official protocol (docs/protocol.md; its deviations: docs/fidelity.md), with the
# per-domain settings in PAPER below; --micro-batch is the micro-batch of one forward/backward
# inside an SFT mini-batch of --sft-batch trajectories (PAPER: the official global mini-batch).
# proposer_brief: the rules of the proposer's brief (lib/briefs.py BRIEFS): the official skills' (paper,
# gpu), or with the project's two additions for a small policy (smoke, cpu; docs/fidelity.md setting 4).
PRESETS = {
    "smoke": dict(model="smoke", threads=1, epochs=1.0, phase_epochs=0.5, harness_iterations=2,
                  train_limit=8, test_limit=4, k=1, batch=2, group=2, micro_batch=8, candidates=2,
                  harness_tasks=2, max_new_tokens=8, deadline=60.0, adaptive_epochs=0.5,
                  harness_patience=1, harness_min_rounds=1, harness_max_rounds=2,
                  proposer_brief="small-model"),
    "cpu": dict(model="cpu", threads="auto", epochs=1.0, phase_epochs=0.375, harness_iterations=2,
                train_limit=64, test_limit=50, test_holdout=50, test_evals="ends", k=4, batch=8,
                group=4, micro_batch=8, lr=3e-4, warmup=2, weight_decay=0.0, candidates=3,
                harness_tasks=24, max_new_tokens=32, temperature=0.6, deadline=300.0,
                adaptive_epochs=0.25, harness_patience=1, harness_min_rounds=1,
                harness_max_rounds=2, math_test_set="generated", math_max_steps=2,
                mutate_order="traces", proposer_brief="small-model"),
    # generation (docs/protocol.md): Qwen3.5 thinks (its template's enable_thinking), no per-call
    # cap but the episode's assistant-token budget (PAPER), the official model length; chess SAN
    # with + and # (docs/protocol.md section 3)
    "paper": dict(threads=None, data="paper", chess_san_marks=True, backend="vllm", vllm_sleep=True,
                  bf16=True, grad_checkpointing=True, phase_epochs=0.6, harness_iterations=6,
                  train_limit=None, test_limit=None, k=8, batch=256, group=8, micro_batch=2, warmup=0,
                  weight_decay=0.01, grad_clip=1.0, candidates=3, null_check="report",
                  proposer_brief="official",
                  harness_tasks=256, harness_samples=1, proposer="claude",
                  proposer_model="claude-opus-4-7", proposer_timeout=2400.0, temperature=1.0,
                  top_k=20, max_new_tokens=8192, thinking="on", max_model_len=32768, deadline=600.0,
                  adaptive_epochs=0.2, harness_patience=2, harness_min_rounds=5,
                  harness_max_rounds=15),
    # gpu: the paper preset's shape on seeded subsets, sized so that run_all.sh's table (3 domains x
    # 6 methods, one process a domain sharing the phases its methods have in common) takes about
    # 12.5 h on one 80 GB card by lib/ops/time_model.py's estimate (docs/gpu.md), with enough RSFT
    # steps for the weights to move. The proposer's own time (a round is a Claude Code session)
    # bounds the rounds, so: the paper's (E, I) = (0.6, 2) ablation cell on 1.2 epochs (weight,
    # harness of re-score + 1 round, weight); 544 train prompts, 32 a step = 10 + 10 RSFT steps, and
    # the SFT mini-batch scaled by 32 / 256 with the rollout batch, so a rollout step makes the
    # paper's 0-6 optimizer steps; M = 3 on 128 harness tasks; G = 8, mean@4 on the test subsets in
    # GPU (SearchQA 15 per benchmark: the interval about 5 % wider than at mean@8, half the
    # evaluation time); the adaptive harness phase scaled with I - 1 (min 1, max 3, patience 1); 256
    # concurrent episodes (the test evaluation keeps the runner's 64); the official h0s and chess
    # SAN (PAPER), but without thinking and with 1,024 tokens a call and 2,048 an episode: at the
    # official 8,192 thinking tokens the table takes about 6x longer
    "gpu": dict(threads=None, data="paper", chess_san_marks=True, backend="vllm", vllm_sleep=True,
                bf16=True, grad_checkpointing=True, epochs=1.2, phase_epochs=0.6,
                harness_iterations=2, train_limit=544, test_limit=None, k=4, batch=32, group=8,
                micro_batch=2, warmup=0, weight_decay=0.01, grad_clip=1.0, candidates=3,
                harness_tasks=128, harness_samples=1, workers=256, proposer="claude", proposer_brief="official",
                proposer_model="claude-opus-4-7", proposer_timeout=2400.0, temperature=1.0,
                top_k=20, thinking="off", max_new_tokens=1024, episode_tokens=2048,
                max_model_len=8192, deadline=600.0, adaptive_epochs=0.2, harness_patience=1,
                harness_min_rounds=1, harness_max_rounds=3),
}
# the paper preset per domain: model; epochs and harness-only rounds (docs/protocol.md); the
# official h0s (docs/protocol.md: searchqa and math call their tools natively; chess has no tools);
# the assistant-token budget of an episode (chess: 8,129, as the official chess config has it) and
# the limit on its first prompt (docs/protocol.md); and the LoRA learning rate (ours: 10x the
# official full fine-tuning rates of 1e-6 and 1e-7, as a rank-16 adapter whose B starts at zero
# moves the model far less per step than a full update at the same rate); the SFT mini-batch:
# officially 64 trajectories on each data-parallel GPU, gradients averaged over the GPUs, so one
# optimizer step covers 64 x the launchers' training GPUs (OFFICIAL_DP_GPUS) of the accepted set
OFFICIAL_SFT_BATCH_PER_GPU = 64
# searchqa: the driver's default N_GPUS_PER_NODE=6 (the retriever holds the other 2 of 8), as the
# WHALE launchers (whale.sh -> alternate.sh) leave it; its 8 is only for the MULTI_RETRIEVE=1
# layout, which no launcher sets. math: 8. chess: the trainer's 1 node x 4 GPUs (the rollout engines
# hold 2 x 6 others)
OFFICIAL_DP_GPUS = {"searchqa": 6, "math": 8, "chess": 4}
PAPER = {
    "searchqa": dict(model="Qwen/Qwen3.5-2B", epochs=4.0, harness_only_rounds=40, lr=1e-5,
                     harness="harnesses/paper/searchqa.py", episode_tokens=8192,
                     max_prompt_tokens=2048,
                     sft_batch=OFFICIAL_SFT_BATCH_PER_GPU * OFFICIAL_DP_GPUS["searchqa"]),
    "math": dict(model="Qwen/Qwen3.5-2B", epochs=6.0, harness_only_rounds=60, lr=1e-6,
                 harness="harnesses/paper/math.py", episode_tokens=8192, max_prompt_tokens=2048,
                 sft_batch=OFFICIAL_SFT_BATCH_PER_GPU * OFFICIAL_DP_GPUS["math"]),
    "chess": dict(model="Qwen/Qwen3.5-4B", epochs=4.0, harness_only_rounds=40, lr=1e-6,
                  harness="harnesses/paper/chess.py", episode_tokens=8129, max_prompt_tokens=4096,
                  sft_batch=OFFICIAL_SFT_BATCH_PER_GPU * OFFICIAL_DP_GPUS["chess"]),
}
# the gpu preset per domain: the paper's model and learning rate; the SFT mini-batch scaled with the
# rollout batch (paper's x 32 / 256: searchqa 48, math 64, chess 32); the test subset (seeded
# samples: SearchQA's per benchmark, 80 of chess's 256 test puzzles; all 60 AIME problems); the
# engine's share of the card, the most that fits beside the trainer on 24, 48 and 80 GB alike
# (scripts/memory_plan.py; searchqa's retriever index takes 32 GiB of the 80 GB card)
GPU = {"searchqa": dict(searchqa_test_per_set=15, gpu_memory=0.45), "math": dict(gpu_memory=0.7),
       "chess": dict(test_limit=80, gpu_memory=0.5)}
# the smallest card (GiB) on which the gpu preset's micro-batch of 2 calls (8,192 tokens, 1,024 trained) fits beside
# the trainer and its sleeping engine, by lib/ops/time_model.memory (tests/test_gpu_plan.py computes it again): on a
# smaller card the preset takes --micro-batch 1, the same update in two halves (chess on a 24 GB card)
GPU_TWO_CALLS_GIB = {"searchqa": 19, "math": 19, "chess": 26}
SCALE = PRESETS["gpu"]["batch"] / PRESETS["paper"]["batch"]
GPU = {domain: dict(model=PAPER[domain]["model"], lr=PAPER[domain]["lr"],
                    harness=PAPER[domain]["harness"],
                    max_prompt_tokens=PAPER[domain]["max_prompt_tokens"],
                    sft_batch=int(PAPER[domain]["sft_batch"] * SCALE), **GPU[domain])
       for domain in GPU}
# D_weight sizes of the paper's data (docs/protocol.md), for plan.py without downloading them
PAPER_TRAIN_SIZES = {"searchqa": 18_946, "math": 17_917, "chess": 16_384}
# the cpu preset per domain: its h0 (harnesses/cpu/; chess, outside the cpu preset's default
# domains, keeps harnesses/chess.py). countdown has none that SmolLM2-135M can start from: on 32 train prompts x 4
# it solved none under harnesses/countdown.py (128 episodes: 69 cut at the 32-token cap, 54 with no expression) nor
# with its three worked examples, read from the tag or the last line (256: each an expression, every one wrong;
# scripts/calibrate_cpu_h0.py --domain countdown, 2026-12-03), so its weights would never move: plan.py --check
# warns, and the fix is a larger --model
CPU = {domain: dict(harness=f"harnesses/cpu/{domain}.py") for domain in ("searchqa", "math")}
# the smoke preset per domain: math's h0 where the random smoke model can be right by chance, so every smoke weight
# phase has successes to train on (harnesses/smoke/math.py says how; why searchqa and chess have none: README, "The
# smoke preset trains"), on the one-step problems, where three in five need one operation; 32 tokens a call, as at
# 8 the model names an operation less often (14 of 128 training rollouts succeeded, 32 of 128 at 32), and G = 4, so
# a weight phase samples 16 episodes
SMOKE = {"math": dict(harness="harnesses/smoke/math.py", math_max_steps=1, max_new_tokens=32, group=4)}
# run_all.sh's table: its domains per preset (DOMAINS=... overrides). cpu leaves chess out: SmolLM2-135M solves
# none, and its long multi-turn prompts cost about 8x a searchqa episode. countdown (the fork template) is in no
# default table. Adaptive WHALE (ADAPTIVE=1) runs where the paper reports it: never on chess.
TABLE_DOMAINS = {"cpu": ("searchqa", "math")}
TABLE_DOMAINS_DEFAULT = ("searchqa", "math", "chess")
ADAPTIVE_DOMAINS = ("searchqa", "math")


def table_domains(preset):
    return TABLE_DOMAINS.get(preset, TABLE_DOMAINS_DEFAULT)


def preset_defaults(name, domain, data=None, card_gib=None):
    """The defaults preset `name` gives a run on `domain` (its bundle, then its per-domain table), as whale.py
    takes them; `data`: the --data flag given; `card_gib`: the card the run trains on (the gpu preset fits its
    micro-batch to it). Raises ValueError for a domain the paper or gpu preset has no settings for."""
    preset = dict(PRESETS[name])
    if name in ("paper", "gpu"):
        table = PAPER if name == "paper" else GPU
        if domain not in table:
            raise ValueError(f"--preset {name}: {domain} has no paper settings (presets.py PAPER: the paper's "
                             "domains); run it with --preset smoke or cpu")
        preset.update(table[domain])
    if name == "gpu" and card_gib and card_gib < GPU_TWO_CALLS_GIB[domain]:
        preset["micro_batch"] = 1
    if name == "cpu":  # chess keeps harnesses/chess.py (not in the cpu preset's table)
        preset.update(CPU.get(domain, {}))
    if name == "smoke":
        preset.update(SMOKE.get(domain, {}))
    if data == "paper":  # the bundled math sets' choices do not apply to the paper's data
        preset.pop("math_test_set", None), preset.pop("math_max_steps", None)
    return preset


def add_preset_arg(parser):
    """--preset on rollout.py, rft.py and meta_harness.py: whale.py's bundles, so a step run alone samples,
    scores and trains as the preset's run does."""
    parser.add_argument("--preset", default=None, choices=sorted(PRESETS),
                        help="take the defaults of whale.py's preset (presets.py) for the flags this script has; "
                             "any flag given still wins (default: none, the script's own defaults)")


# A preset's setting (whale.py's flag) -> the flag of the same meaning on a script that names it otherwise: the one
# mapping parse_with_preset reads. meta_harness.py's search is one harness phase, so the preset's adaptive harness
# phase reaches its stop flags (the paper preset: at most 15 rounds, at least 5, patience 2, as the official
# alternate.sh calls the drivers: --iterations 15 --early-stop-min-iters 5 --early-stop-patience 2). Not mapped,
# as their units differ: rft.py's --steps and --stop-patience count RSFT steps, the preset's epochs and
# adaptive_epochs count epochs of the train split (whale.py turns them into steps); rollout.py's --limit and --k
# depend on its --split (split_defaults).
SCRIPT_FLAGS = {"harness_max_rounds": "rounds", "harness_patience": "patience", "harness_min_rounds": "min_rounds"}


def parse_with_preset(parser, argv=None, card=None):
    """Every command's parse (whale.py, rft.py, meta_harness.py, rollout.py), in two passes: the first learns
    --preset, --domain and --data; the preset's defaults for the flags this parser has go in (each setting to the
    flag of its name or of its SCRIPT_FLAGS name; rollout.py's --split: the preset's sizes of that split), and the
    second pass lets any flag given win. A preset value for a flag the script lacks (whale.py's budgets on rft.py)
    is left out. card(first pass) -> the GiB of the card the run trains on, or None: the gpu preset fits its
    micro-batch to it (whale.py). A domain the preset has no settings for is the parser's one-line error.

        args = parse_with_preset(parser, argv)   # python rollout.py --domain math --preset cpu --split harness ...
    """
    first = parser.parse_args(argv)
    if first.preset is None or first.domain is None:  # the script's own defaults
        return first
    card_gib = card(first) if card else None
    try:
        preset = preset_defaults(first.preset, first.domain, first.data, card_gib)
    except ValueError as e:
        parser.error(str(e))
    flags = {action.dest for action in parser._actions}
    named = {key if key in flags else SCRIPT_FLAGS.get(key, key): value for key, value in preset.items()}
    defaults = {dest: value for dest, value in named.items() if dest in flags}
    if "split" in flags:
        defaults.update(split_defaults(preset, first.split))
    parser.set_defaults(**defaults)
    args = parser.parse_args(argv)
    bundled = PRESETS[first.preset]["micro_batch"]
    if preset["micro_batch"] != bundled and args.micro_batch == preset["micro_batch"]:  # a card lowered it, no flag
        print(f"{first.preset} preset: --micro-batch {args.micro_batch} on this {card_gib:.1f} GiB card, where its "
              f"{bundled} calls do not fit beside the trainer and the engine (presets.GPU_TWO_CALLS_GIB)",
              file=sys.stderr)
    return args


def flags_beyond(parser, args, shown=()):
    """The flags of `args` (parse_with_preset's parse with `parser`) whose values differ from the defaults that parse
    gave them (the preset's, else the parser's own), as the words that set them: ["--test-limit 2", "--bf16"]. A flag
    given at its default is not one of them: the run is the preset's there. shown: the dests left out (those a run's
    first line names already)."""
    words = []
    for action in parser._actions:
        if not action.option_strings or action.dest in shown or not hasattr(args, action.dest):
            continue
        value = getattr(args, action.dest)
        if value == action.default:
            continue
        flag = next((f for f in action.option_strings if f.startswith("--")), action.option_strings[0])
        if isinstance(value, bool):  # a switch (store_true): given
            words.append(flag)
        elif isinstance(action, argparse._AppendAction):
            words += [f"{flag} {shlex.quote(str(v))}" for v in value]
        elif isinstance(value, list):
            words.append(" ".join([flag, *(shlex.quote(str(v)) for v in value)]))
        else:
            words.append(f"{flag} {shlex.quote(str(value))}")
    return words


def split_defaults(preset, split):
    """rollout.py's --limit, --k and --test-holdout as the preset's run sizes `split`: the harness set as the search
    scores a harness (its --harness-tasks, --harness-samples samples: meta_harness.py's default 1 unless the preset
    says), the test evaluation (its --test-limit past --test-holdout, mean@--k), the train sample (--train-limit,
    --group samples a task)."""
    if split == "harness":
        return {"limit": preset.get("harness_tasks"), "k": preset.get("harness_samples", 1), "test_holdout": 0}
    if split == "test":
        return {"limit": preset.get("test_limit"), "k": preset["k"], "test_holdout": preset.get("test_holdout", 0)}
    # train: as an RSFT step samples a prompt, --group episodes each (the test holdout is the test split's)
    return {"limit": preset.get("train_limit"), "k": preset.get("group"), "test_holdout": 0}


def table_methods(schedule="fixed"):
    """run_all.sh's methods, in the method table's order (lib/methods.py): every method but the experimental rows
    (lib/methods.table_names) under the fixed schedule, those the table also runs under the adaptive one (adaptive
    WHALE) where ADAPTIVE=1. An experimental row runs when asked: whale.py --method NAME."""
    return [name for name in table_names() if schedule == "fixed" or METHODS[name].adaptive]
