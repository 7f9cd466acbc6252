"""rft.py: sampler, stop rule, completion-only loss, bad input, and (with rollout) accounting, learning, resume."""
import argparse
import json
import math
import types

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

import rft
from domains import Domain
from fixtures.configs import rsft_config
from lib.backends.hf_backend import HFBackend
from lib.backends.models import chat_ids, load_model
from lib.backends.policy import Policy, add_lora
from lib.run_folder.store import Store, about


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """On 2 shared, busy cores two intra-op threads spin against each other (10-50x slower): use one."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def tiny_model(vocab=64, layers=2, mlp=64, seed=0):
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(Qwen3Config(vocab_size=vocab, hidden_size=32, intermediate_size=mlp, num_hidden_layers=layers,
                                        num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                        max_position_embeddings=512))


def rft_args(**kw):
    return rsft_config(**kw)


def grads(model, examples, micro_batch=8):
    """The gradient sft_update would apply (normalised over all examples' completion tokens), per parameter."""
    model.zero_grad()
    n = sum(len(c) for _, c in examples)
    for batch in rft.length_batches(examples, micro_batch):
        (rft.completion_nll(model, batch) / n).backward()
    return {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}


def same(a, b):
    return a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-7) for k in a)


# -----------------------------------------------------------------------------
# pure pieces

def test_sampler_takes_exact_epoch_fractions_and_resumes():
    s = rft.EpochSampler(10, seed=3)
    first = s.take(6)
    assert s.epochs == pytest.approx(0.6)
    second = s.take(6)
    assert s.epochs == pytest.approx(1.2)
    assert sorted(first + second[:4]) == list(range(10))  # epoch 0 is a permutation
    resumed = rft.EpochSampler(10, 3, **s.state_dict())
    assert resumed.take(9) == s.take(9)
    assert rft.EpochSampler(10, 4).take(10) != rft.EpochSampler(10, 3).take(10)  # the seed matters


def test_stop_rule_on_fixed_series():
    stop = rft.should_stop_weight_phase
    rising = [0.1 * i for i in range(10)]
    assert not any(stop(rising[:n], 2, 2, 2) for n in range(11))
    plateau = [0.1, 0.5, 0.5, 0.5, 0.5]  # window 1: best set at step 2, equal values are no new best
    assert [stop(plateau[:n], 1, 1, 3) for n in range(1, 6)] == [False, False, False, False, True]
    falling = [0.9, 0.5, 0.2, 0.1]
    assert not stop(falling[:2], 2, 3, 1)  # shorter than min_len
    assert stop(falling[:3], 2, 3, 1)
    noisy = [0.2, 0.6, 0.2, 0.6, 0.2, 0.6]  # window 2 smooths the noise: mean stays 0.4 after the first step
    assert stop(noisy, 2, 2, 4) and not stop(noisy, 2, 2, 5)


def test_loss_masks_the_prompt_and_is_normalised_over_all_completion_tokens():
    model = tiny_model(layers=0)  # no attention: a position's output depends on its own token only
    ex = [([5, 6, 7, 8, 9], [10, 11, 12]), ([1, 2, 9], [3])]
    changed_prompt = [([40, 41, 42, 43, 9], [10, 11, 12]), ([33, 9], [3])]  # the last prompt token predicts the first completion token
    assert same(grads(model, ex), grads(model, changed_prompt))
    assert not same(grads(model, ex), grads(model, [([5, 6, 7, 8, 9], [10, 11, 13]), ([1, 2, 9], [3])]))
    # normalisation: summed NLL / all completion tokens (4), not a mean of per-example means; minibatching is invisible
    deep = tiny_model(layers=2)
    nll = [-torch.log_softmax(deep(input_ids=torch.tensor([p + c])).logits[0], -1)[len(p) - 1 + j, t]
           for p, c in ex for j, t in enumerate(c)]
    with torch.no_grad():
        assert rft.completion_nll(deep, ex).item() / 4 == pytest.approx(sum(nll).item() / 4, rel=1e-5)
    assert same(grads(deep, ex, micro_batch=1), grads(deep, ex, micro_batch=2))


def test_the_shared_prompt_prefix_runs_once_with_the_same_loss_and_gradients(monkeypatch):
    """The leading tokens every example shares run once (their KV copied to each row), and the loss and
    gradients are those of every example run whole: prompts of several lengths, two with the same prompt
    and the same first completion token, one that is all shared part but its last token."""
    model = tiny_model(layers=2)
    head = list(range(1, 21))
    ex = [(head + [30, 31], [40, 41, 42]), (head + [30, 31], [40, 41, 43]), (head + [33], [44]),
          (head + [34, 35, 36, 37], [45, 46]), (head[:18], [47, 48])]
    real, seen = rft.shared_prefix, []
    monkeypatch.setattr(rft, "shared_prefix", lambda *a: seen.append(real(*a)) or seen[-1])
    shared = grads(model, ex)
    with torch.no_grad():
        shared_loss = rft.completion_nll(model, ex).item()
    assert seen == [17, 17]  # the shortest prompt keeps its last token: 18 - 1
    monkeypatch.setattr(rft, "shared_prefix", lambda *a: 0)
    whole = grads(model, ex)
    with torch.no_grad():
        assert shared_loss == pytest.approx(rft.completion_nll(model, ex).item(), rel=1e-6)
    assert whole.keys() == shared.keys()
    assert all(torch.allclose(whole[k], shared[k], atol=1e-6) for k in whole)


def test_the_opening_runs_per_row_under_gradient_checkpointing_or_dropout(monkeypatch):
    """Gradient checkpointing runs the decoder without a cache, and dropout would draw one mask for all
    rows in a shared opening: either way every example runs whole."""
    monkeypatch.setattr(rft, "shared_prefix", lambda *a: pytest.fail("no shared opening here"))
    ex = [(list(range(1, 21)) + [30], [40, 41]), (list(range(1, 21)) + [31], [42])]
    model = tiny_model(layers=2)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    assert rft.completion_nll(model, ex).item() > 0
    args = argparse.Namespace(lora_rank=4, lora_alpha=8, lora_dropout=0.1, lora_targets="all-linear")
    adapted = add_lora(tiny_model(layers=2), args).train()
    assert rft.completion_nll(adapted, ex).item() > 0


def test_tool_output_in_the_prompt_leaves_the_gradient_unchanged():
    _, tok = load_model("smoke")
    model = tiny_model(vocab=len(tok), layers=0)
    completion = tok("The answer is \\boxed{47}<|im_end|>", add_special_tokens=False)["input_ids"]

    def example(tool_output):
        messages = [{"role": "user", "content": "What is 12 + 35?"},
                    {"role": "assistant", "content": "```python\nprint(12 + 35)\n```"},
                    {"role": "user", "content": f"Output: {tool_output}"}]
        return [(chat_ids(tok, messages), completion)]

    assert same(grads(model, example("47")), grads(model, example("Traceback: NameError, a much longer tool text")))


def test_update_makes_one_optimizer_step_per_sft_batch_on_the_lora_weights_only():
    model = add_lora(tiny_model(), rft_args(lora_rank=4))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    before = {k: p.detach().clone() for k, p in model.named_parameters()}
    trajectories = [[([1, 2, 3], [4, 5]), ([6, 7], [8, 9, 10])], [([3, 4], [5])]]
    losses = rft.sft_update(model, opt, trajectories, 64, 1, 1.0)
    assert len(losses) == 1 and losses[0] > 0 and opt.state_dict()["state"][0]["step"] == 1
    changed = {k for k, p in model.named_parameters() if not torch.equal(p, before[k])}
    assert changed and all("lora_" in k for k in changed)


@pytest.mark.parametrize("accepted, sft_batch, steps", [(1, 64, 1), (64, 64, 1), (65, 64, 2), (130, 64, 3), (5, 2, 3)])
def test_each_rollout_step_makes_ceil_accepted_over_sft_batch_optimizer_steps(accepted, sft_batch, steps):
    model = add_lora(tiny_model(layers=1), rft_args(lora_rank=2))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    trajectories = [[([1 + i % 7, 2], [3 + i % 5])] for i in range(accepted)]
    losses = rft.sft_update(model, opt, trajectories, sft_batch, 8, 1.0)
    assert len(losses) == steps and opt.state_dict()["state"][0]["step"] == steps


def test_a_mini_batch_loss_is_the_token_mean_within_that_mini_batch():
    """Trajectories in order, 2 to a mini-batch: each step's loss is its own completion tokens' mean NLL."""
    model = tiny_model(layers=0)
    a, b, c = [([1, 2], [3, 4, 5])], [([6], [7])], [([8, 9], [10, 11])]
    expected = []
    with torch.no_grad():
        for group in ([a, b], [c]):
            examples = [e for t in group for e in t]
            expected.append(rft.completion_nll(model, examples).item() / sum(len(x) for _, x in examples))
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: the weights stay, so each loss is comparable
    assert rft.sft_update(model, opt, [a, b, c], 2, 8, 0.0) == pytest.approx(expected, rel=1e-5)


# -----------------------------------------------------------------------------
# bad input

class FakeDomain(Domain):
    """Reward 1 when the reply starts with `target`; tasks are all the same prompt."""
    name = "fake"
    TOOL_METHODS = ()

    def __init__(self, n=8, target="x"):
        self.n, self.target = n, target

    def load(self, split):
        return [{"id": f"t{i}", "question": "Say something."} for i in range(self.n)]

    def public(self, task):
        return {"question": task["question"]}

    def tools(self, task):
        return types.SimpleNamespace()

    def reward(self, task, answer, tools):
        return float(isinstance(answer, str) and answer.startswith(self.target))


def test_bad_input_gives_clear_errors(tmp_path):
    def backend(**kw):  # a policy whose backend only holds the model (nothing samples here)
        model = tiny_model(**kw)
        return Policy(model, None, types.SimpleNamespace(model=model))
    train = FakeDomain().load("train")
    with pytest.raises(ValueError, match=r"--batch 9 does not fit .*\(8 prompts\)"):  # checked before the model loads
        rft.check_batch(9, len(train), "fake")
    with pytest.raises(ValueError, match="--lora-targets 'wq,wv' does not fit the model"):
        rft.RSFT(rft_args(batch=4, lora_targets="wq,wv"), backend(), FakeDomain(), tmp_path / "c", train)
    # an adapter trained on another model (other MLP width, fewer layers) does not load
    rft.RSFT(rft_args(batch=4), backend(), FakeDomain(), tmp_path / "d", train).save(updated=False)
    for other in (backend(mlp=96), backend(layers=1)):
        with pytest.raises(ValueError, match="does not fit this model"):
            rft.RSFT(rft_args(batch=4), other, FakeDomain(), tmp_path / "e", train, tmp_path / "d")


# -----------------------------------------------------------------------------
# with the runner: accounting, learning, resume

HARNESS = '''"""Ask once for one token; the reply is the answer."""
def run(task, llm, tools):
    return {"answer": llm([{"role": "user", "content": task["question"]}], max_tokens=1)}
'''


def smoke_trainer(tmp_path, out, target, checkpoint=None, **kw):
    (tmp_path / "h.py").write_text(HARNESS)
    model, tok = load_model("smoke")
    kw = {"batch": 4, "group": 4, "lr": 1e-2, "warmup": 0, "workers": 8, **kw}
    domain = FakeDomain(8, target)
    return rft.RSFT(rft_args(**kw), Policy(model, tok, HFBackend(model, tok)), domain, tmp_path / out,
                    domain.load("train"), checkpoint)


def lora_weights(trainer):
    return {k: p.detach().clone() for k, p in trainer.policy.model.named_parameters() if "lora_" in k}


def test_rollout_accounting_when_nothing_is_accepted(tmp_path):
    trainer = smoke_trainer(tmp_path, "out", "never a reply")
    before = lora_weights(trainer)
    rows = [trainer.step(tmp_path / "h.py") for _ in range(2)]
    assert trainer.rollouts == 32 and [r["rollouts"] for r in rows] == [16, 32]
    assert [(r["skipped"], r["loss"], r["accept_rate"]) for r in rows] == [(True, None, 0.0)] * 2
    assert trainer.epoch_progress == 1.0
    assert same(before, lora_weights(trainer))


def test_learning_raises_the_training_reward(tmp_path):
    """Reward 1 when the one-token reply starts with "S" (about 6 % of the random smoke model's replies)."""
    gains = []
    for seed in range(3):
        trainer = smoke_trainer(tmp_path, f"seed{seed}", "S", group=8, seed=seed)
        rewards = [trainer.step(tmp_path / "h.py")["reward"] for _ in range(4)]
        assert rewards[-1] > rewards[0] + 0.3, rewards
        gains.append(rewards[-1] - rewards[0])
    assert sum(gains) / len(gains) > 0.5, gains


def test_resume_matches_an_uninterrupted_run_and_counts_accepted_rollouts(tmp_path):
    whole = smoke_trainer(tmp_path, "whole", "")  # every reply starts with "": all accepted, every step trains
    rows = [whole.step(tmp_path / "h.py") for _ in range(2)]
    assert whole.rollouts == 32 and [r["rollouts"] for r in rows] == [16, 32]
    assert rows[0]["accept_rate"] == 1.0 and rows[0]["prompts_accepted"] == 4 and rows[0]["examples"] == 16
    assert rows[0]["accepted_tokens"] == 16 and rows[0]["loss"] > 0 and not rows[0]["skipped"]
    smoke_trainer(tmp_path, "split", "").step(tmp_path / "h.py")
    resumed = smoke_trainer(tmp_path, "resumed", "", checkpoint=tmp_path / "split")  # from step 1's checkpoint
    assert resumed.step_count == 1 and resumed.rollouts == 16 and resumed.weights_id == whole_id(tmp_path, "split")
    again = resumed.step(tmp_path / "h.py")
    assert same(lora_weights(whole), lora_weights(resumed)) and again["loss"] == rows[1]["loss"]
    assert resumed.optimizer.state_dict()["state"][0]["step"] == 2
    assert resumed.weights_id == whole.weights_id != "base"


def whole_id(tmp_path, out):
    return json.loads((tmp_path / out / "state.json").read_text())["weights"]


def test_a_kill_inside_a_save_leaves_the_store_where_it_was_and_the_step_is_made_again(tmp_path, monkeypatch):
    """A kill inside RSFT.save (here: while the optimizer is written) leaves the trainer's folder half written:
    nothing reads it. The store's item of the step before is where a rerun goes on (rft.train_cli, whale.py's weight
    phase), and the step made again is the step the killed run made."""
    store, key = Store(tmp_path / "store"), {"phase": 1}
    trainer = smoke_trainer(tmp_path, "out", "")
    store.put("weights", key, trainer.folder, about={"rows": [trainer.step(tmp_path / "h.py")]})
    second = smoke_trainer(tmp_path, "whole", "", checkpoint=store.find("weights", key)).step(tmp_path / "h.py")
    monkeypatch.setattr(rft.torch, "save", lambda *a, **kw: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        trainer.step(tmp_path / "h.py")
    monkeypatch.undo()
    assert not (tmp_path / "out" / "state.json").exists()  # cut
    item = store.find("weights", key)
    assert item is not None and about(item)["rows"][0]["step"] == 1
    resumed = smoke_trainer(tmp_path, "out", "", checkpoint=item)
    assert resumed.step(tmp_path / "h.py") | {"sample_s": 0, "train_s": 0} == second | {"sample_s": 0, "train_s": 0}


class RecordingBackend(HFBackend):
    """The hf backend, noting every adapter sync (the engine backends load the adapter and run the canary there)."""

    def __init__(self, model, tok):
        super().__init__(model, tok)
        self.synced = []

    def sync_adapter(self, path):
        self.synced.append(path)
        super().sync_adapter(path)


def test_resume_syncs_the_engine_with_the_checkpoint_adapter_first(tmp_path):
    fresh = smoke_trainer(tmp_path, "out", "")
    fresh.save(updated=False)  # a checkpoint, as after a finished step
    def recording_policy():
        model, tok = load_model("smoke")
        return Policy(model, tok, RecordingBackend(model, tok))
    policy, train = recording_policy(), FakeDomain(8, "").load("train")
    rft.RSFT(rft_args(batch=4, group=1), policy, FakeDomain(8, ""), tmp_path / "new", train)
    assert policy.backend.synced == []  # a fresh run: the engine serves the base model, as the zero-init adapter does
    resumed = rft.RSFT(rft_args(batch=4, group=1), recording_policy(), FakeDomain(8, ""), tmp_path / "resumed", train,
                       tmp_path / "out")
    assert resumed.policy.backend.synced == [str(tmp_path / "resumed" / "adapter")]  # before any rollout


@pytest.mark.parametrize("domain", ["searchqa", "math", "chess"])
def test_the_paper_sft_mini_batch_makes_the_official_number_of_optimizer_steps(domain):
    """Officially every data-parallel GPU takes an even share of the accepted set and steps once per 64 of its
    share, the GPUs' gradients averaged: ceil(ceil(accepted / GPUs) / 64) steps (6 / 8 / 4 GPUs). The paper
    preset's global mini-batch of 64 x GPUs makes as many, on the same trajectories per step; the gpu preset's
    is scaled with its rollout batch (32 prompts a step, not 256), so a rollout step makes as many at most."""
    import whale
    gpus = {"searchqa": 6, "math": 8, "chess": 4}[domain]
    [paper] = whale.parse_args(["--domain", domain, "--preset", "paper"])
    [gpu] = whale.parse_args(["--domain", domain, "--preset", "gpu"])
    assert paper.sft_batch == 64 * gpus and gpu.sft_batch == 64 * gpus * gpu.batch // paper.batch
    assert paper.batch * paper.group // paper.sft_batch == gpu.batch * gpu.group // gpu.sft_batch
    model = add_lora(tiny_model(layers=1, mlp=8), rft_args(lora_rank=1))
    for accepted in (1, 64 * gpus, 64 * gpus + 1, 1000, 2048):
        official = math.ceil(math.ceil(accepted / gpus) / 64)  # the busiest GPU's steps
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
        trajectories = [[([1 + i % 7], [3 + i % 5])] for i in range(accepted)]
        losses = rft.sft_update(model, opt, trajectories, paper.sft_batch, 4096, 1.0)
        assert len(losses) == official, (domain, accepted)


class SleepingBackend(HFBackend):
    """The hf backend as vllm --vllm-sleep behaves: asleep while the trainer trains, awake for an adapter sync or
    a generate; it notes what happens in order."""

    def __init__(self, model, tok, log):
        super().__init__(model, tok)
        self.log, self.sleeping = log, False

    def sleep(self):
        self.log.append("sleep")
        self.sleeping = True

    def wake(self):
        if self.sleeping:
            self.log.append("wake")
            self.sleeping = False

    def generate(self, prompts, **kw):
        self.wake()
        return super().generate(prompts, **kw)

    def sync_adapter(self, path):
        self.wake()
        super().sync_adapter(path)


def test_the_trainer_hands_its_memory_back_between_the_update_and_the_wake(tmp_path, monkeypatch):
    log = []
    (tmp_path / "h.py").write_text(HARNESS)
    model, tok = load_model("smoke")
    policy = Policy(model, tok, SleepingBackend(model, tok, log))
    trainer = rft.RSFT(rft_args(batch=4, group=2, workers=8), policy, FakeDomain(8, ""), tmp_path / "out",
                       FakeDomain(8, "").load("train"))
    update = rft.sft_update
    monkeypatch.setattr(rft, "sft_update", lambda *a: log.append("update") or update(*a))
    monkeypatch.setattr(rft.torch.cuda, "empty_cache", lambda: log.append("empty_cache"))
    monkeypatch.setattr(rft.torch.cuda, "is_available", lambda: True)  # as on a GPU, from the update on
    monkeypatch.setattr(rft, "get_rng_state", lambda: {"torch": torch.get_rng_state(), "python": None, "cuda": None})
    trainer.step(tmp_path / "h.py")
    assert log == ["sleep", "update", "empty_cache", "wake"]


def test_a_second_rft_py_on_the_same_folder_is_refused_while_the_first_runs(tmp_path):
    """rft.py's store (OUT/store) serves one command at a time, like whale.py's: a second command on the same --out is
    refused in one line before any model loads, and runs once the first has ended."""
    from lib.run_folder.store import only_command
    out = tmp_path / "rft"
    argv = ["--domain", "math", "--harness", "harnesses/math.py", "--model", "smoke", "--steps", "1", "--batch", "2",
            "--group", "2", "--out", str(out)]
    with only_command(out / "store"), pytest.raises(SystemExit) as e:  # the first command, still running
        rft.main(argv)
    assert str(e.value.code).startswith(f"rft.py: error: {out / 'store'} is in use by another command")
    assert not (out / "metrics.jsonl").exists()
    rft.main(argv)
    assert json.loads((out / "summary.json").read_text())["steps"] == 1
