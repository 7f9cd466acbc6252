"""lib/ops/time_model.py and the gpu preset: the project's table fits 12 h on one 80 GB card by its estimate (a
fork's rows are measured beside it), plan.py prints each run's hours, the memory plan counts what it says, and
run_all.sh picks gpu on a GPU. No GPU, model or dataset: the estimate is arithmetic on model configs and whale.py's
plan."""
import os
import re
import shutil
import subprocess
import sys
from dataclasses import replace

import pytest

import plan
import whale
from fixtures.tiny_method import STAGEWISE_FST
from lib.methods import METHODS, table_names
from lib.ops import time_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def planned(capsys, *argv):
    [args] = whale.parse_args(argv)
    [est] = plan.print_plan([args])
    return args, est, capsys.readouterr().out


def domain_plan(capsys, domain, methods=None):
    """run_all.sh's process for one domain under the gpu preset: its methods (the table's), in its order."""
    methods = methods or [m for d, m, _ in time_model.TABLE if d == domain]
    runs = whale.parse_args(["--preset", "gpu", "--domain", domain, "--method", *methods])
    estimates = plan.print_plan(runs)
    return runs, estimates, capsys.readouterr().out


# The project's rows of the method table (lib/methods.py), the table the gpu preset is sized for. A fork's rows
# (README "Adding a method") join run_all.sh's table after them and are measured, not bounded: their hours are
# the fork's to spend, and they change none of the project's runs' hours (a run reuses only what runs before it made)
OURS = ("harness-only", "weight-only", "stagewise", "stagewise-hw", "fast-slow", "whale")


def test_the_gpu_table_fits_in_about_12_hours_on_80_gb_with_20_rsft_steps_a_run(capsys):
    """run_all.sh's table (3 domains x the table's methods, one process a domain): at least 5x the 4 RSFT steps a
    run of the previous gpu preset for every row, the project's rows in about 12 h on one 80 GB card by the
    estimate."""
    assert [m for _, m, _ in time_model.TABLE] == table_names() * len(time_model.DOMAIN_MODEL)
    hours = 0.0
    for domain in time_model.DOMAIN_MODEL:
        runs, estimates, _ = domain_plan(capsys, domain)
        for args in runs:
            steps, _ = whale.budgets(args, args.train_limit)
            assert steps in (0, 20), (domain, args.method)
        ours = [e["total"] for args, e in zip(runs, estimates) if args.method in OURS]
        assert len(ours) == len(OURS) and all(0 < h < 1.5 for h in ours), (domain, ours)
        hours += sum(ours)
    assert 10 < hours <= 12.75, f"the gpu preset's table takes {hours:.1f} h by lib/ops/time_model.py"


def test_a_forks_row_in_the_table_is_measured_and_leaves_the_projects_hours_as_they_were(capsys, monkeypatch):
    """A row a fork adds to run_all.sh's table (tests/fixtures/tiny_method.py's, not experimental) runs after the
    project's in a domain's process: it gets the same budgets and an estimate of its own, which plan.py's total
    counts, and every earlier run's estimate is what it was without it (so the project's hours are bounded alone)."""
    row = replace(STAGEWISE_FST, name="a-forks-row")  # a name no fork copies from the README
    runs, estimates, _ = domain_plan(capsys, "math")
    monkeypatch.setitem(METHODS, row.name, row)
    assert table_names()[-1] == row.name
    forked, forked_estimates, out = domain_plan(capsys, "math", table_names())
    assert [a.method for a in forked] == [a.method for a in runs] + [row.name]
    assert forked_estimates[:-1] == estimates
    assert whale.budgets(forked[-1], forked[-1].train_limit)[0] == 20  # its hours: 0 where a row before it made all
    assert f"estimated {sum(e['total'] for e in forked_estimates):.2f} h for these {len(forked)} runs" in out


def test_a_domains_runs_share_their_common_phases_in_one_process(capsys):
    runs, estimates, out = domain_plan(capsys, "math")
    phases = [whale.fixed_phases(a, a.train_limit) for a in runs]
    # harness-only, weight-only, stagewise (weight-only's two weight phases), stagewise-hw (harness-only's first
    # round), fast-slow and whale (weight-only's first weight phase); a fork's rows come after them
    shared = time_model.shared_phases([(a.method, p) for a, p in zip(runs, phases)])
    assert shared[:6] == [0, 0, 2, 1, 1, 1] and [a.method for a in runs] == table_names()
    own = {a.method: e["counts"] for a, e in zip(runs, estimates)}
    assert own["stagewise"]["steps"] == 0 and own["stagewise-hw"]["rounds"] == 0
    assert own["whale"]["steps"] == own["fast-slow"]["steps"] == 10 and own["whale"]["rounds"] == 1
    assert [c["starts"] for c in own.values()] == [1] + [0] * (len(runs) - 1)  # one engine start and start eval
    assert own["harness-only"]["evals"] == 3 and own["whale"]["evals"] == 2  # whale's phase 1 is weight-only's
    assert "reused from the runs before it in this process: phase 0's evaluation and phases 1-2" in out
    assert (f"for these {len(runs)} runs in one process (reused: {sum(shared)} of their phases and {len(runs) - 1} "
            "start evaluations)") in out
    # fast-slow's searches are its own even where whale's would be the same
    whales = phases[[a.method for a in runs].index("whale")]
    assert time_model.shared_phases([("whale", whales), ("fast-slow", whales)]) == [0, 1]


def test_the_gpu_preset_keeps_the_paper_shape(capsys):
    for domain in ("searchqa", "math", "chess"):
        args, _, out = planned(capsys, "--preset", "gpu", "--domain", domain)
        paper, _, _ = planned(capsys, "--preset", "paper", "--domain", domain)
        for flag in ("model", "lr", "group", "candidates", "phase_epochs", "micro_batch",
                     "temperature", "top_k", "data", "backend", "vllm_sleep", "bf16", "proposer", "proposer_model",
                     "harness", "max_prompt_tokens"):
            assert getattr(args, flag) == getattr(paper, flag), (domain, flag)
        # the stated reductions: no thinking, 1,024 tokens a call and 2,048 an episode (the paper: 8,192
        # thinking); mean@4; 32 prompts a step with the SFT mini-batch scaled to keep the paper's optimizer steps
        # per rollout step
        assert (args.thinking, args.max_new_tokens, args.episode_tokens, args.k) == ("off", 1024, 2048, 4)
        assert (paper.thinking, paper.max_new_tokens, paper.k) == ("on", 8192, 8)
        assert args.batch * args.group / args.sft_batch == paper.batch * paper.group / paper.sft_batch
        assert whale.fixed_phases(args, args.train_limit) == [("weight", 10), ("harness", 1), ("weight", 10)]
        assert "re-score + 1 rounds" in out
        [only] = whale.parse_args(["--preset", "gpu", "--domain", domain, "--method", "harness-only"])
        assert whale.budgets(only, args.train_limit) == (0, 2)


def test_plan_prints_each_runs_hours_and_their_sum(capsys):
    methods = ["whale", "weight-only", "harness-only"]
    plan.main(["--preset", "gpu", "--domain", "math", "--method", *methods])
    out = capsys.readouterr().out
    each = [float(line.split()[1]) for line in out.splitlines()
            if line.startswith("estimated") and "on one 80 GB" in line]
    assert len(each) == 3 and all(h > 0 for h in each)
    [total] = [line for line in out.splitlines() if "for these 3 runs in one process" in line]
    assert float(total.split()[1]) == pytest.approx(sum(each), abs=0.02)
    # a model the plan does not know gets no estimate, and says so
    plan.main(["--preset", "smoke", "--domain", "math"])
    assert "no time estimate for --model smoke" in capsys.readouterr().out


def test_the_estimate_counts_what_the_plan_prints(capsys):
    """run_counts (the estimate's input) and print_plan's totals are the same counts."""
    for method in METHODS:
        args, est, out = planned(capsys, "--preset", "gpu", "--domain", "searchqa", "--method", method)
        c = est["counts"]
        assert f"total: {c['train'] + c['harness']:,d} rollouts ({c['train']:,d} training, {c['harness']:,d} " in out
        steps = f"{c['steps']} {whale.step_name(args.weight_step)} steps"  # RSFT steps, or a fork's step's
        assert f"= {c['test']:,d}" in out and f"{steps}, {c['rounds']} proposer rounds" in out


def test_time_grows_with_the_work_and_the_slower_card():
    counts = lambda steps, rounds: time_model.run_counts([("weight", steps), ("harness", rounds), ("weight", steps)],
                                                       64, 8, 3, 128, 1, 80, 8)
    small, large = (time_model.hours("Qwen3.5-4B", "chess", counts(n, 1)) for n in (2, 4))
    assert large["rollouts"] > small["rollouts"] and large["sft"] > small["sft"] and large["test"] == small["test"]
    assert time_model.hours("Qwen3.5-4B", "chess", counts(2, 1), card_gb=48)["total"] > small["total"]
    slow = time_model.hours("Qwen3.5-4B", "chess", counts(2, 1), proposer_s=2400)
    assert slow["proposer"] == pytest.approx(2 * small["proposer"]) and small["proposer"] == pytest.approx(1 / 3)
    # a run whose first phases an earlier run of its process made pays only for the rest
    reused = time_model.run_counts([("weight", 2), ("harness", 1), ("weight", 2)], 64, 8, 3, 128, 1, 80, 8,
                                   shared=1, first=False)
    assert (reused["steps"], reused["rounds"], reused["evals"], reused["starts"]) == (2, 1, 2, 0)
    assert time_model.hours("Qwen3.5-4B", "chess", reused)["total"] < small["total"]
    # the thinking-length episode costs more than 1,024 tokens a call; the CPU retriever bounds searchqa
    assert time_model.hours("Qwen3.5-4B", "chess", counts(2, 1), max_new_tokens=8192)["rollouts"] > 2 * small["rollouts"]
    gpu, cpu = (time_model.hours("Qwen3.5-2B", "searchqa", counts(2, 1), 80, retriever=r) for r in ("gpu", "cpu"))
    assert cpu["rollouts"] > 2 * gpu["rollouts"]
    assert time_model.hours("Qwen3.5-2B", "math", counts(2, 1), fla=False)["sft"] == pytest.approx(
        time_model.NO_FLA_SFT_FACTOR * time_model.hours("Qwen3.5-2B", "math", counts(2, 1))["sft"])


def test_the_memory_plan_counts_the_retriever_the_states_and_thinking_lengths():
    kv, state = time_model.cache_sizes("Qwen3.5-2B")
    assert kv == 6 * 2 * 2 * 256 * 2  # 6 full-attention layers, 2 KV heads of 256, K and V in bf16
    assert state == 18 * (16 * 128 * 128 * 4 + 6144 * 3 * 2)  # 18 DeltaNet layers: fp32 state + conv window
    alone, beside = (time_model.memory("Qwen3.5-2B", 80, r) for r in (None, "gpu"))
    assert alone["engine"] - beside["engine"] == time_model.RETRIEVER_GPU_BYTES > 30 * time_model.GiB
    # the engine's sequences at the model's full length are fewer than at 8k, by the KV a token
    short, full = (time_model.memory("Qwen3.5-4B", 80, None, 0.5, context=c)["seqs"] for c in (8192, time_model.MODEL_LEN))
    assert 0 < full < short
    # a thinking-length call: its loss alone (8,192 trained tokens x 248,320 vocab x 10 bytes) passes 19 GiB
    context, completion = time_model.LONGEST["thinking"]["math"]
    assert time_model.activation_bytes("Qwen3.5-2B", 1, context, completion) > 8192 * 248320 * 10
    assert time_model.memory("Qwen3.5-2B", 24, None, None, context, completion)["largest"] == 0
    assert time_model.memory("Qwen3.5-2B", 80, None, None, context, completion)["largest"] >= 1
    # the gpu preset's engine share fits beside the trainer on every card, its micro-batch of 2 calls too but for
    # chess on 24 GB (peft's fp32 input casts pass the card there: --micro-batch 1, the same update in two halves)
    for domain, share in (("searchqa", 0.45), ("math", 0.7), ("chess", 0.5)):
        [args] = whale.parse_args(["--preset", "gpu", "--domain", domain])
        assert args.gpu_memory == share
        for card in time_model.CARDS:
            where = time_model.CARD_RETRIEVER[card] if domain == "searchqa" else None
            micro_batch = 1 if (domain, card) == ("chess", 24) else 2
            mem = time_model.memory(time_model.DOMAIN_MODEL[domain], card, where, share, micro_batch=micro_batch)
            assert mem["fits"], (domain, card)
            assert mem["largest"] == 1 if micro_batch == 1 else mem["largest"] >= 2, (domain, card)
            # the engine wakes beside the trainer's handed-back memory: within the card, short of its free share
            assert mem["wake"] <= card * time_model.GiB * (1 - time_model.FREE_SHARE), (domain, card)
    # without the hand-back the trainer's SFT peak stays reserved at the wake: searchqa with the index on 80 GB
    # and math on 24 GB would need more than the card
    searchqa = time_model.memory("Qwen3.5-2B", 80, "gpu", 0.45, micro_batch=2)
    assert searchqa["wake_without_hand_back"] > 80 * time_model.GiB > searchqa["wake"]
    assert time_model.memory("Qwen3.5-2B", 24, None, 0.7, micro_batch=2)["wake_without_hand_back"] > 24 * time_model.GiB


def test_the_plan_counts_peft_s_fp32_copy_of_each_lora_input():
    """peft casts a LoRA Linear's bf16 input to the adapter's fp32 and lora_A keeps the copy for its backward:
    the pinned peft does so (a saved fp32 tensor of the input's shape), and the plan counts one copy per LoRA
    Linear of the recomputed layer, ~1.25 GiB at 2 x 8,192 tokens on the 2B model (18,432-20,480 floats a
    token: its GatedDeltaNet layer's inputs)."""
    torch = pytest.importorskip("torch")
    from peft import LoraConfig, get_peft_model
    base = torch.nn.Sequential(torch.nn.Linear(8, 4)).to(torch.bfloat16)
    lora = get_peft_model(base, LoraConfig(r=2, target_modules=["0"]))
    x = torch.randn(3, 8, dtype=torch.bfloat16, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        lora(x).sum().backward()
    assert any(t.dtype == torch.float32 and t.shape == x.shape for t in saved)
    c = time_model.config("Qwen3.5-2B")
    casts = time_model.lora_casts(c, 2 * 8192)
    assert casts == 2 * 8192 * 4 * (4 * 2048 + 16 * 128 + 2 * 2048 + 6144)  # qkv, z, b, a, out; gate, up, down
    assert casts / time_model.GiB == pytest.approx(1.25)
    without = time_model.activation_bytes("Qwen3.5-2B", 2, 8192, 1024) - casts
    assert casts > 0.1 * without  # not a rounding error: 24 GB chess loses its 2-call micro-batch to it


def test_param_counts_are_the_transformers_models():
    torch = pytest.importorskip("torch")
    modeling = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
    from transformers import Qwen3_5TextConfig
    for name in time_model.MODELS:
        with torch.device("meta"):
            model = modeling.Qwen3_5ForCausalLM(Qwen3_5TextConfig(**time_model.config(name)))
        lora = sum(16 * (m.in_features + m.out_features) for n, m in model.named_modules()
                   if isinstance(m, torch.nn.Linear) and not n.startswith("lm_head"))
        assert time_model.param_counts(name) == (sum(p.numel() for p in model.parameters()), lora)
        assert model.config.layer_types.count("full_attention") == time_model.layer_counts(time_model.config(name))[1]


def test_interval_halfwidth_is_between_the_binomial_of_tasks_and_of_samples():
    n, k, p = 80, 8, 0.3
    tasks = 1.96 * (p * (1 - p) / n) ** 0.5
    samples = 1.96 * (p * (1 - p) / (n * k)) ** 0.5
    assert time_model.interval_halfwidth(n, k, p, rho=1.0) == pytest.approx(tasks)
    assert time_model.interval_halfwidth(n, k, p, rho=0.0) == pytest.approx(samples)
    assert samples < time_model.interval_halfwidth(n, k, p) < tasks


def run_all_preset(tmp_path, cuda, **env):
    """run_all.sh's preset choice with a stub `python` (every call logged, lib/ops/driver.py's preset answering gpu
    when `cuda`; what it answers on a real machine: tests/test_driver.py). A copy of run_all.sh in tmp_path runs
    there, so the logs it writes under results/ stay out of the repository."""
    log = tmp_path / "calls.log"
    stub = tmp_path / "python"
    stub.write_text('#!/usr/bin/env bash\necho "$*" >> "$STUB_LOG"\n'
                    'case "$*" in *"lib/ops/driver.py preset"*) [ "$STUB_CUDA_RC" = 0 ] && echo gpu || echo cpu ;;\n'
                    # the tables of presets.py are read for real
                    f'  *"import presets"*) PYTHONPATH={ROOT} exec {sys.executable} "$@" ;; esac\n'
                    'exit 0\n')
    stub.chmod(0o755)
    env = {"PATH": f"{tmp_path}:{os.environ['PATH']}", "VIRTUAL_ENV": str(tmp_path), "STUB_LOG": str(log),
           "STUB_CUDA_RC": "0" if cuda else "1", "DOMAINS": "math", "ADAPTIVE": "0", "HOME": str(tmp_path), **env}
    shutil.copy(os.path.join(ROOT, "run_all.sh"), tmp_path)
    done = subprocess.run(["bash", str(tmp_path / "run_all.sh")], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    calls = log.read_text().splitlines()
    return done.stdout, [c for c in calls if c.startswith("whale.py") and "--check" not in c]


def methods_of(call):
    words = call.split()
    after = words[words.index("--method") + 1:]
    return [w for w in after[:next((i for i, w in enumerate(after) if w.startswith("--")), len(after))]]


def test_run_all_picks_gpu_when_cuda_is_visible(tmp_path):
    out, runs = run_all_preset(tmp_path, cuda=True, DOMAINS="", ADAPTIVE="")  # run_all.sh's defaults
    assert "preset gpu" in out and "about 7.6 h" in out
    assert runs and all("--preset gpu" in r for r in runs)
    # one process a domain, the table's methods on one engine; adaptive WHALE only with ADAPTIVE=1
    assert [methods_of(r) for r in runs] == [table_names()] * 3 and not any("adaptive" in r for r in runs)


def test_run_all_keeps_cpu_without_cuda_and_paper_when_asked(tmp_path):
    (tmp_path / "cpu").mkdir()
    (tmp_path / "paper").mkdir()
    out, runs = run_all_preset(tmp_path / "cpu", cuda=False)
    assert "preset cpu" in out and all("--preset cpu" in r for r in runs)
    out, runs = run_all_preset(tmp_path / "paper", cuda=True, PRESET="paper")
    assert "preset paper" in out and runs and all("--preset paper" in r for r in runs)


def test_run_all_runs_adaptive_whale_where_the_paper_reports_it(tmp_path):
    out, runs = run_all_preset(tmp_path, cuda=True, DOMAINS="math chess", ADAPTIVE="1")
    adaptive = [r for r in runs if "--schedule adaptive" in r]
    assert len(adaptive) == 1 and "--domain math" in adaptive[0]
    # the count it announces is the runs it starts (none was done)
    assert f" {sum(len(methods_of(r)) for r in runs)} runs;" in out


def test_docs_gpu_md_holds_exactly_what_memory_plan_prints():
    """docs/gpu.md's tables and figures are scripts/memory_plan.py --markdown's output, pasted whole and in order
    between its markers: a change to the plan that is not pasted there fails here (rerun the script, paste)."""
    done = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "memory_plan.py"), "--markdown"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    doc = open(os.path.join(ROOT, "docs", "gpu.md")).read()
    blocks = re.findall(r"<!-- scripts/memory_plan.py --markdown: from here -->\n(.*?)\n"
                        r"<!-- scripts/memory_plan.py --markdown: to here -->", doc, re.S)
    paragraphs = lambda text: [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]
    assert len(blocks) == 5 and paragraphs("\n\n".join(blocks)) == paragraphs(done.stdout)


def test_the_gpu_preset_fits_its_micro_batch_to_the_card():
    """presets.GPU_TWO_CALLS_GIB is the smallest card (whole GiB) on which the gpu preset's 2 calls fit beside the
    trainer and its sleeping engine by the plan; on a smaller card the preset takes 1 (chess on 24 GB), on a larger
    one its 2, and without a card (no GPU) its 2."""
    from presets import GPU_TWO_CALLS_GIB, preset_defaults
    for domain, name in time_model.DOMAIN_MODEL.items():
        [args] = whale.parse_args(["--preset", "gpu", "--domain", domain])
        flags = time_model.trainer_flags(args)
        largest = lambda gib: time_model.memory(name, None, card_bytes=gib * time_model.GiB, **flags)["largest"]
        least = GPU_TWO_CALLS_GIB[domain]
        assert largest(least) >= 2 > largest(least - 1) >= 1, domain
        assert preset_defaults("gpu", domain, card_gib=least - 0.5)["micro_batch"] == 1
        assert preset_defaults("gpu", domain, card_gib=least)["micro_batch"] == 2
        assert preset_defaults("gpu", domain)["micro_batch"] == 2
    assert preset_defaults("gpu", "chess", card_gib=24)["micro_batch"] == 1
    assert preset_defaults("paper", "chess", card_gib=24)["micro_batch"] == 2  # the official 2: the preflight decides


def test_the_night_with_turns_is_the_cards_work_unless_one_domain_alone_is_longer():
    """time_model.night by hand: without turns every hour of every run; with turns the card's own work (each run's
    hours less its proposer's) one process after another plus a switch per proposer round, unless one chain of
    runs alone (its card work and its proposer's, which never overlap) is longer."""
    est = lambda total, proposer, rounds: {"total": total, "proposer": proposer, "counts": {"rounds": rounds}}
    chains = [[est(2.0, 1.0, 3), est(1.0, 0.0, 0)], [est(1.5, 0.5, 1)]]
    night = time_model.night(chains, switch_s=36)  # 4 rounds x 36 s = 0.04 h
    assert night["without"] == 4.5 and night["card"] == (2.0 - 1.0 + 1.0) + (1.5 - 0.5)
    assert night["with"] == pytest.approx(3.0 + 0.04) and night["longest"] == 3.0
    waits = time_model.night([[est(5.0, 4.5, 9)], [est(1.0, 0.0, 0)]], switch_s=36)  # one proposer-bound chain
    assert waits["card"] + waits["switches"] == pytest.approx(0.5 + 1.0 + 0.09) and waits["with"] == 5.0


def test_the_gpu_table_with_turns_fits_8_and_a_half_hours_on_80_gb(capsys):
    """run_all.sh's default on one 80 GB card, the domains' processes taking turns: the card's own work, under
    8.5 h by the estimate, against the 12 h and more of one domain after another."""
    chains = [domain_plan(capsys, domain)[1] for domain in time_model.DOMAIN_MODEL]
    night = time_model.night(chains)
    assert night["with"] <= 8.5 < 12 <= night["without"], night
    assert night["with"] == pytest.approx(night["card"] + night["switches"])  # the card, not a proposer, bounds it
