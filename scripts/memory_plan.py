"""The GPU plan of the gpu and paper presets: memory per card and hours per run, the tables of docs/gpu.md.

    python scripts/memory_plan.py                # every table
    python scripts/memory_plan.py --markdown     # the same, as markdown: docs/gpu.md holds it whole, in its marked
                                                 # blocks (tests/test_gpu_plan.py fails where they differ)

Memory and time come from lib/ops/time_model.py (model configs, stated token lengths, bandwidth and FLOP rates);
each run's phases, steps, rounds and test size from whale.py's own plan, exactly what
`python plan.py --preset P --domain D --method M` prints. No GPU, model or dataset is needed.
"""
import argparse
import contextlib
import io
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import plan  # noqa: E402
import whale  # noqa: E402
from lib.methods import DEFAULT  # noqa: E402
from lib.ops import time_model as g  # noqa: E402
from lib.backends.policy import engine_seqs  # noqa: E402

GiB = g.GiB
CAPPED_FLAGS = ("--max-new-tokens", "1024", "--max-model-len", "8192")  # the paper preset at 1,024 tokens a call


def run_args(preset, domain, method, schedule, extra=()):
    [args] = whale.parse_args(["--preset", preset, "--domain", domain, "--method", method,
                               "--schedule", schedule, *extra])
    return args


def table_estimates(preset, card_gb, extra=(), domains=None, **kw):
    """[(domain, run name, estimate of its own work)] of run_all.sh's table under `preset` on one card, as
    plan.print_plan gives it for each of run_all.sh's processes (a domain's methods, then adaptive WHALE where
    run_all.sh's ADAPTIVE default adds it: under paper, not gpu)."""
    table = g.TABLE + (g.ADAPTIVE if preset == "paper" else [])
    rows = []
    for domain in g.DOMAIN_MODEL:
        for schedule in ("fixed", "adaptive"):
            methods = [m for d, m, s in table if d == domain and s == schedule]
            if not methods or (domains and domain not in domains):
                continue
            runs = [run_args(preset, domain, method, schedule, extra) for method in methods]
            with contextlib.redirect_stdout(io.StringIO()):
                estimates = plan.print_plan(runs, card_gb)
            for args, est in zip(runs, estimates):
                if kw:  # the same run under other assumptions (proposer time, fla)
                    est = g.hours(g.model_name(args.model), domain, est["counts"], card_gb, args.max_new_tokens,
                                  args.workers, args.gpu_memory, **kw)
                rows.append((domain, whale.method_name(args), est))
    return rows


def total(rows):
    return sum(est["total"] for _, _, est in rows)


# -----------------------------------------------------------------------------
# the tables

def memory_rows():
    """Per domain and card: the trainer, the retriever, the engine at the gpu preset's --gpu-memory and at the
    most the trainer leaves, and the micro-batches that fit, for the gpu preset's calls and thinking ones."""
    rows = []
    for domain, name in g.DOMAIN_MODEL.items():
        gpu = run_args("gpu", domain, DEFAULT, "fixed")
        share, seqs = gpu.gpu_memory, engine_seqs(gpu.workers)
        for card in g.CARDS:
            where = g.CARD_RETRIEVER[card] if domain == "searchqa" else None
            capped, thinking = g.LONGEST["capped"][domain], g.LONGEST["thinking"][domain]
            at = g.memory(name, card, where, share, *capped, micro_batch=2)
            most = g.memory(name, card, where, None, *capped)
            deep = g.memory(name, card, where, None, *thinking)
            long_seqs = g.memory(name, card, where, share, context=g.MODEL_LEN)["seqs"]
            retriever = {"gpu": f"GPU {at['retriever'] / GiB:.0f}", "cpu": f"CPU ({g.RETRIEVER_CPU_RAM / GiB:.0f} RAM)",
                         None: "-"}[where]
            blocks = g.cache_blocks(name, at["kv"])[0]
            workers = g.workers_that_fit(blocks)
            micro = f"NO: the gpu preset takes {at['largest']}" if at["largest"] < 2 else "yes"
            rows.append([domain, name, f"{card} GB", f"{(at['weights'] + at['lora_opt']) / GiB:.1f}", retriever,
                         f"{share}: {at['engine'] / GiB:.0f} GiB, {at['seqs']} / {long_seqs}",
                         f"{blocks} ({'yes' if workers >= seqs else f'NO: --workers {workers}'})",
                         f"{most['max_gpu_memory']:.2f}", f"{at['act'] / GiB:.1f} ({micro})",
                         f"{at['wake'] / GiB:.0f} ({at['wake_without_hand_back'] / GiB:.0f})",
                         most["largest"],
                         f"{deep['largest'] or 'NO'} ({g.activation_bytes(name, 1, *thinking) / GiB:.0f} GiB for 1)"])
    head = ["domain", "model", "card", "trainer GiB", "retriever GiB", "engine (--gpu-memory): seqs at 8k / 32k",
            f"cache blocks, Triton prefill (>= --workers {seqs} + {g.BLOCK_MARGIN:.0%}?)",
            "most --gpu-memory", "SFT, 2 calls of 8k (1k trained): GiB",
            "card at the wake after an update, GiB (without the trainer's hand-back)", "largest --micro-batch",
            "thinking calls that fit"]
    return head, rows


def run_rows(rows):
    head = ["domain", "run", "RSFT steps (own)", "phases reused", "rollouts", "test", "SFT", "engine", "proposer",
            "total h"]
    out = [[d, run, est["counts"]["steps"], est["counts"]["shared"], *(f"{est[k]:.2f}" for k in g.PARTS),
            f"{est['total']:.2f}"] for d, run, est in rows]
    sums = [f"{sum(est[k] for _, _, est in rows):.1f}" for k in g.PARTS]
    steps = sum(est["counts"]["steps"] for _, _, est in rows)
    return head, out + [["all", f"{len(rows)} runs", steps, "", *sums, f"**{total(rows):.1f}**"]]


def chains(rows):
    """run_all.sh's process chains of a table's estimates: a domain's runs (its process, then its adaptive one)."""
    return [[e for d, _, e in rows if d == domain] for domain in g.DOMAIN_MODEL if any(d == domain for d, _, _ in rows)]


def domain_rows(cards, preset, extra=(), **kw):
    """Hours per domain (its runs of the table) and in all, on each card: one domain after another (TURNS=0), and
    with turns on the card (run_all.sh's default: time_model.night)."""
    per = {card: table_estimates(preset, card, extra, **kw) for card in cards}
    head = ["card"] + list(g.DOMAIN_MODEL) + ["all (h)", "days", "with turns (h)", "days"]
    out = []
    for card, rows in per.items():
        sums = [sum(e["total"] for d, _, e in rows if d == domain) for domain in g.DOMAIN_MODEL]
        turns = g.night(chains(rows))["with"]
        out.append([f"{card} GB ({g.CARDS[card][0]})", *(f"{s:.1f}" for s in sums), f"{sum(sums):.1f}",
                    f"{sum(sums) / 24:.1f}", f"**{turns:.1f}**", f"{turns / 24:.1f}"])
    return head, out


# (cards, trainer ranks) of the layouts docs/gpu.md lays out: one card; a node of 8 with the trainer on one card and
# 7 engine replicas; a node of 8 with 8 trainer ranks beside 8 replicas (torchrun); four such nodes
LAYOUTS = ((1, 1), (8, 1), (8, 8), (32, 32))


def scale_rows(preset="paper", cards=(80, 141)):
    """The table's days on each card class and layout (time_model.hours' gpus and ranks), each layout at the
    --workers that fills its replicas (64 each, the runner's default on one card)."""
    head = ["card", "cards", "trainer ranks", "engine replicas", "--workers", "SFT (days)", "all (days)"]
    out = []
    for card in cards:
        for gpus, ranks in LAYOUTS:
            engines = g.engine_replicas(gpus, ranks)
            workers = () if gpus == 1 else ("--workers", str(g.DEFAULT_WORKERS * engines))
            rows = table_estimates(preset, card, workers, gpus=gpus, ranks=ranks)
            out.append([f"{card} GB ({g.CARDS[card][0]})", gpus, ranks, engines, workers[1] if workers else "default",
                        f"{sum(e['sft'] for _, _, e in rows) / 24:.1f}", f"{total(rows) / 24:.1f}"])
    return head, out


def width_rows():
    """95 % half-widths of one cell's mean@k at the gpu and paper presets' test sizes and k."""
    k_gpu, k_paper = (run_args(preset, "math", DEFAULT, "fixed").k for preset in ("gpu", "paper"))
    head = ["domain", "test tasks (gpu / paper)", f"gpu mean@{k_gpu}, p = 0.1", "p = 0.3", "p = 0.5",
            f"paper mean@{k_paper}, p = 0.3"]
    out = []
    for domain in g.DOMAIN_MODEL:
        n_gpu = table_estimates("gpu", 80, domains=[domain])[0][2]["counts"]["n_test"]
        n_paper = table_estimates("paper", 80, domains=[domain])[0][2]["counts"]["n_test"]
        half = lambda n, k, p: f"±{100 * g.interval_halfwidth(n, k, p):.1f}"
        out.append([domain, f"{n_gpu} / {n_paper}", half(n_gpu, k_gpu, 0.1), half(n_gpu, k_gpu, 0.3),
                    half(n_gpu, k_gpu, 0.5), half(n_paper, k_paper, 0.3)])
    return head, out


def print_table(head, rows, markdown):
    if markdown:  # a blank line first: a markdown table starts a block of its own
        print("\n| " + " | ".join(head) + " |\n|" + "---|" * len(head))
        for r in rows:
            print("| " + " | ".join(map(str, r)) + " |")
    else:
        widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
        for r in [head] + rows:
            print("  ".join(str(x).ljust(w) for x, w in zip(r, widths)))
    print()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--markdown", action="store_true", help="markdown tables (for docs/gpu.md)")
    args = p.parse_args()
    md = args.markdown

    rows = table_estimates("gpu", 80)
    print(f"the gpu preset on one 80 GB card ({g.CARDS[80][0]}), hours of each run's own work (a domain's runs in "
          "one process: phases an earlier run made are reused):")
    print_table(*run_rows(rows), md)
    adaptive = []
    for domain, method, schedule in g.ADAPTIVE:
        with contextlib.redirect_stdout(io.StringIO()):
            [est] = plan.print_plan([run_args("gpu", domain, method, schedule)])
        adaptive.append(est["total"])
    print(f"ADAPTIVE=1 adds adaptive WHALE on {' and '.join(d for d, _, _ in g.ADAPTIVE)}: "
          f"{' + '.join(f'{h:.1f}' for h in adaptive)} h")
    fast, slow = (table_estimates("gpu", 80, proposer_s=s) for s in (g.PROPOSER_S / 2, 2 * g.PROPOSER_S))
    no_fla = total(table_estimates("gpu", 80, fla=False))
    print(f"with {g.PROPOSER_S // 120:.0f} or {2 * g.PROPOSER_S // 60} min a proposer round instead of "
          f"{g.PROPOSER_S // 60}: {total(fast):.1f} or {total(slow):.1f} h; without fla-core (SFT x "
          f"{g.NO_FLA_SFT_FACTOR:g}): {no_fla:.1f} h")
    night = g.night(chains(rows))
    print(f"with turns on the card (run_all.sh's default, TURNS=1: the domains' processes side by side, each holding "
          f"the card but for its proposer's waits): {night['with']:.1f} h, the card's own work {night['card']:.1f} h "
          f"+ {night['switches']:.2f} h of switches ({g.SWITCH_S} s a proposer round), the longest domain alone "
          f"{night['longest']:.1f} h; with {g.PROPOSER_S // 120:.0f} or {2 * g.PROPOSER_S // 60} min a round: "
          f"{g.night(chains(fast))['with']:.1f} or {g.night(chains(slow))['with']:.1f} h\n")
    print("the gpu preset on each card, hours per domain (run_all.sh's runs of it):")
    print_table(*domain_rows(g.CARDS, "gpu"), md)
    for card in (24, 48):
        elsewhere = total(table_estimates("gpu", card, domains=["searchqa"], retriever="other-gpu"))
        print(f"searchqa on {card} GB with the retriever's index on a second GPU: {elsewhere:.1f} h")
    print()
    print("memory per card (LoRA rank 16 on all linear layers, bf16, gradient checkpointing, the engine asleep "
          "while the trainer trains; searchqa's retriever on the card where it fits):")
    print_table(*memory_rows(), md)
    for name in g.MODELS:
        params, lora = g.param_counts(name)
        kv, state = g.cache_sizes(name)
        delta, full = g.layer_counts(g.config(name))
        print(f"{name}: {params / 1e9:.2f}B parameters, LoRA {lora / 1e6:.1f}M; KV {kv / 1024:.0f} KiB a token "
              f"({full} full-attention layers); GatedDeltaNet state {state / 2**20:.1f} MiB a sequence "
              f"({delta} layers)")
    print()

    print("95 % half-width of one cell's mean@k (points), Var = p (1 - p) (rho + (1 - rho) / k) / n, rho = 0.5:")
    print_table(*width_rows(), md)
    print()
    paper = table_estimates("paper", 80)
    capped = table_estimates("paper", 80, CAPPED_FLAGS)
    print("the paper preset (the official thinking-length episode: 8,192 assistant tokens, --max-model-len 32768), "
          "then the same at 1,024 tokens a call (--max-new-tokens 1024 --max-model-len 8192), on each card:")
    print_table(*domain_rows(g.CARDS, "paper"), md)
    print_table(*domain_rows(g.CARDS, "paper", CAPPED_FLAGS), md)
    wide = table_estimates("paper", 80, ("--workers", "256"))
    for label, rows in (("paper", paper), ("paper, --workers 256", wide), ("paper at 1,024 tokens a call", capped)):
        engine = sum(e["rollouts"] + e["test"] for _, _, e in rows)
        rest = total(rows) - engine
        print(f"{label} on 80 GB: {total(rows) / 24:.0f} GPU-days, of them {engine / 24:.0f} days of rollouts "
              f"(what N engine GPUs share) and {rest / 24:.0f} of SFT, engine start and proposer; with the rollouts "
              f"on 7 more cards (vllm serve --data-parallel-size 7): {(rest + engine / 7) / 24:.0f} days")
    print()
    print("the paper preset's table on several cards: the rollouts on vllm serve --data-parallel-size (the replicas), "
          "the SFT update over torchrun's trainer ranks (lib/backends/ranks.py):")
    print_table(*scale_rows(), md)


if __name__ == "__main__":
    main()
