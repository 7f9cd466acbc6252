"""Data-parallel RSFT under torchrun (lib/backends/ranks.py), two ranks with gloo on the CPU: the update equals the
one-process one, a resume across a kill is exact, an empty share does not hang, a failing rank stops the others, and
whale.py runs two methods (one reusing the other's phase) with its summary recording the rank count. Each launch runs
a few RSFT steps of the smoke model on made-up episodes (tests/fixtures/ranks_run.py) or a tiny whale.py run."""
import json
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from lib.backends import ranks
from lib.run_folder.store import Store

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN = os.path.join(ROOT, "tests", "fixtures", "ranks_run.py")
LAUNCH_S = 240  # the most one launch may take on a busy 2-core machine; a hang shows as this timeout
# the DP update sums each gradient in another order (its ranks' shares, then the all-reduce), and the shared prompt
# prefix runs per share. AdamW divides each gradient by its own running size, so a weight whose gradient is near
# zero moves by a rounding's whim: after 8 optimizer steps at lr 1e-4, 111 of 65,536 lora_A weights differ by up to
# 1.9e-5 on an AVX-512 Xeon (8e-8 on another CPU). The update as a whole agrees: measured there, lora_B (which
# starts at zero, so it is the update itself) to a relative norm of 6e-5, the LoRA weights to 4e-6
UPDATE_TOLERANCE, WEIGHT_TOLERANCE = 1e-3, 1e-4  # relative norms


def torchrun(*args, cwd=ROOT):
    """Two ranks on this machine (--standalone: a free port, so parallel launches never collide)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *args],
               cwd, env)


def run(cmd, cwd=ROOT, env=None):
    started = time.time()
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=LAUNCH_S)
    done.seconds = time.time() - started
    return done


def adapter(out):
    return load_file(os.path.join(out, "ckpt", "adapter", "adapter_model.safetensors"))


def relative_gap(mine, theirs, part="lora_"):
    """||mine - theirs|| / ||theirs|| over the adapter's weights whose names hold `part`."""
    keys = [k for k in theirs if part in k]
    gap = torch.cat([(mine[k] - theirs[k]).flatten() for k in keys]).norm()
    return (gap / torch.cat([theirs[k].flatten() for k in keys]).norm()).item()


def losses(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(line)["loss"] for line in f]


def test_the_update_over_two_ranks_equals_one_process_and_resumes_exactly_across_a_kill(tmp_path):
    from fixtures import ranks_run
    one, two, killed = (str(tmp_path / name) for name in ("one", "two", "killed"))
    ranks_run.lead(SimpleNamespace(out=one, steps=3, die_after=None, fail_rank=None))  # here: one process
    done = torchrun(RUN, two, "--steps", "3")
    assert done.returncode == 0, done.stderr[-2000:]
    # every step trains (3 of 4 episodes accepted), and step 1's last mini-batch holds one trajectory: rank 1's share
    # of it is empty, and it still takes the step
    rows = [json.loads(line) for line in open(os.path.join(two, "metrics.jsonl"))]
    assert [r["optimizer_steps"] for r in rows] == [3, 3, 2] and rows[0]["accept_rate"] == 9 / 12
    assert losses(two) == pytest.approx(losses(one), rel=1e-6)
    mine, theirs = adapter(two), adapter(one)
    assert relative_gap(mine, theirs, "lora_B") < UPDATE_TOLERANCE and relative_gap(mine, theirs) < WEIGHT_TOLERANCE
    assert any(not torch.equal(mine[k], theirs[k]) for k in theirs)  # two ranks did sum in another order
    follower = torch.load(os.path.join(two, "rank1.pt"))  # rank 1 took the same steps: the same weights, bit for bit
    assert len(follower) == len(mine) and all(torch.equal(follower[k.replace(".weight", ".default.weight")], mine[k])
                                              for k in mine)
    assert json.load(open(os.path.join(two, "ckpt", "state.json")))["ranks"] == 2

    # rank 0 killed after step 2's checkpoint: torchrun stops rank 1, and the rerun finishes step 3 exactly
    done = torchrun(RUN, killed, "--steps", "3", "--die-after", "2")
    assert done.returncode != 0 and len(losses(killed)) == 2
    done = torchrun(RUN, killed, "--steps", "3")
    assert done.returncode == 0, done.stderr[-2000:]
    assert losses(killed) == losses(two)
    resumed = adapter(killed)
    assert all(torch.equal(resumed[k], mine[k]) for k in mine)

    # the rank count is in the store's key: a launch on another count finds none of these steps (it starts over,
    # since the count changes the update's float sums, so the samples after it)
    assert Store(os.path.join(two, "store")).find("weights", {"run": "ranks_run", "ranks": 1}) is None
    assert Store(os.path.join(two, "store")).find("weights", {"run": "ranks_run", "ranks": 2}) is not None


def test_a_failing_follower_stops_rank_0_in_bounded_time(tmp_path):
    done = torchrun(RUN, str(tmp_path / "out"), "--steps", "3", "--fail-rank", "1")
    assert done.returncode != 0 and done.seconds < LAUNCH_S
    lines = done.stderr.splitlines()
    assert lines.count("ranks_run.py: error: trainer rank 1: ValueError: an injected failure") == 1, done.stderr[-3000:]


def test_rank_0_failing_tells_the_followers_to_stop(tmp_path):
    done = torchrun(RUN, str(tmp_path / "out"), "--steps", "3", "--fail-rank", "0")
    assert done.returncode != 0 and done.seconds < LAUNCH_S
    assert "ranks_run.py: error: an injected failure" in done.stderr.splitlines(), done.stderr[-3000:]
    assert "trainer rank 1" not in done.stderr  # the follower stopped without a second line


def test_rank_0_failing_inside_an_update_ends_the_followers_within_a_minute(tmp_path):
    """Rank 0 fails in its own share of an update the follower has entered: the follower, waiting in the gradient sum
    that rank 0 will never join, stops within ranks.ABORT_POLL_S (not at STEP_TIMEOUT's 30 minutes), silently."""
    done = torchrun(RUN, str(tmp_path / "out"), "--steps", "3", "--fail-rank", "0", "--fail-in-update")
    assert done.returncode != 0 and done.seconds < 60, (done.seconds, done.stderr[-3000:])
    assert "ranks_run.py: error: an injected failure" in done.stderr.splitlines(), done.stderr[-3000:]
    assert "trainer rank 1" not in done.stderr


def test_whale_runs_two_methods_on_two_ranks_and_its_summary_says_so(tmp_path):
    """weight-only, then whale: whale's first weight phase is weight-only's (the same RSFT steps under h0), taken from
    the store into whale's trainer folder, which rank 1 loads from the shared file system."""
    done = torchrun(os.path.join(ROOT, "whale.py"), "--domain", "math", "--preset", "smoke", "--method", "weight-only",
                    "whale", "--harness", os.path.join(ROOT, "harnesses", "math.py"), "--test-limit", "2", "--k", "1",
                    "--train-limit", "4", "--batch", "2", "--group", "2", "--harness-tasks", "2",
                    "--max-new-tokens", "4", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "weights: RSFT steps 1-1 taken from" in done.stdout
    for method in ("weight-only", "whale"):
        summary = json.load(open(tmp_path / "results" / "smoke" / "math" / method / "summary.json"))
        assert summary["trainer_ranks"] == 2 and summary["rsft_steps"] == 2


def test_a_mini_batch_is_split_over_the_ranks_by_tokens():
    sized = lambda *n: [[([0] * (k - 1), [1])] for k in n]  # one example of k tokens each
    trajectories = sized(10, 1, 2, 9, 3)
    assert ranks.split(trajectories, 2) == [sized(10, 1, 2), sized(9, 3)]  # 13 and 12 tokens, each in its order
    assert ranks.split(trajectories[:1], 2) == [sized(10), []]  # fewer trajectories than ranks: an empty share
    assert ranks.split(trajectories, 1) == [trajectories]
    assert ranks.share(trajectories) is trajectories  # one process: all of it, untouched


def test_more_than_one_rank_refuses_the_in_process_engine():
    with pytest.raises(ValueError, match=r"--backend vllm runs the engine \(and --vllm-sleep puts it to sleep\) "
                                         "inside the trainer's process on one card: with 2 trainer ranks, serve the "
                                         "model with `vllm serve --data-parallel-size 2` and pass --backend openai"):
        ranks.check_launch("vllm", 2)
    ranks.check_launch("openai", 2)
    ranks.check_launch("vllm", 1)  # one rank: today's flags


def test_the_time_model_splits_the_update_over_the_ranks_and_the_rollouts_over_the_replicas():
    from lib.ops import time_model
    counts = time_model.run_counts([("weight", 4), ("harness", 2)], batch=64, group=8, candidates=3, harness_tasks=128,
                                   harness_samples=1, n_test=60, k=8)
    one = time_model.hours("Qwen3.5-2B", "math", counts, 141)
    assert time_model.hours("Qwen3.5-2B", "math", counts, 141, gpus=1, ranks=1) == one  # the default is one card
    assert [time_model.engine_replicas(g, r) for g, r in ((1, 1), (8, 1), (8, 8), (32, 32))] == [1, 7, 8, 32]
    lone, eight = (time_model.hours("Qwen3.5-2B", "math", counts, 141, workers=64 * e, gpus=8, ranks=r)
                   for e, r in ((7, 1), (8, 8)))
    assert lone["sft"] == one["sft"] and eight["sft"] == pytest.approx(one["sft"] / 8)
    assert eight["rollouts"] < lone["rollouts"] < one["rollouts"] / 3  # 64 episodes at once on each replica
    assert eight["proposer"] == one["proposer"] and eight["engine"] == one["engine"]
    line = time_model.describe(eight, 141)
    assert line.startswith(f"estimated {eight['total']:.2f} h on 8 x 141 GB cards (H200; ") and \
        f"the trainer's share (SFT over 8 ranks) {eight['sft']:.2f} h" in line


def test_the_preflight_refuses_a_local_run_folder_for_several_nodes(tmp_path):
    from lib.ops import preflight
    kind, _ = ranks.file_system(tmp_path)
    args = SimpleNamespace(ranks=16, nodes=2, backend="openai", out=str(tmp_path / "run"))
    if kind in ranks.SHARED_FILE_SYSTEMS:
        pytest.skip(f"{tmp_path} is on a shared {kind} file system here")
    with pytest.raises(preflight.Failed, match=f"a local {kind} file system, but 16 ranks on 2 nodes read rank 0's "
                                               "checkpoints from it: put --out on a file system every node mounts"):
        preflight.check_ranks([args])
    args.nodes = 1
    assert preflight.check_ranks([args]) == "16 ranks on one node; rollouts through --backend openai"
    args.backend = "vllm"
    with pytest.raises(preflight.Failed, match=r"--backend vllm runs the engine \(and --vllm-sleep"):
        preflight.check_ranks([args])
