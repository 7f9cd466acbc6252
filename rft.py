r"""
Online rejection-sampling fine-tuning (RSFT) with LoRA: the weight phase of WHALE, also the weight-only baseline.

    python rft.py --domain math --harness harnesses/math.py --model smoke --steps 4 --batch 8 \
        --group 8 --out out/rft
    python rft.py --domain math --harness harnesses/math.py --model cpu --steps 5 --batch 4 \
        --group 4 --max-new-tokens 96 --out out/rft-cpu
    python rft.py --domain math --harness my_math.py --preset cpu --steps 3 --out out/rft-cpu
        # --preset: whale.py's preset (presets.py) for the flags this script has (model, sampling,
        # data, batch, G, SFT, --train-limit); any flag given still wins
    torchrun --nproc_per_node 2 rft.py --domain math --harness harnesses/math.py --model smoke \
        --steps 4 --batch 8 --group 8 --out out/rft-dp
        # data-parallel SFT over 2 trainer ranks (lib/backends/ranks.py); rank 0 samples as one process does

Each rollout step (RSFT.step) is sample, filter, update:
- sample: the next --batch prompts of the train split from a seeded epoch sampler (a fresh shuffle per
  epoch, so "0.6 epoch" is exactly 0.6 * len(train) prompts), G = --group episodes each, under the
  current harness with the current weights;
- filter: keep every successful episode (reward > lib/rules.SUCCESS; all of them, not best-of-n): an
  accepted trajectory, whose every llm() call is one example (prompt ids, sampled completion ids);
- update: one pass over the accepted trajectories in order, one optimizer step per SFT mini-batch of
  --sft-batch of them, so ceil(accepted / sft_batch) steps (the paper presets: 64 per GPU x the
  official runs' data-parallel GPUs, presets.OFFICIAL_DP_GPUS); a mini-batch's loss is the summed
  NLL of its completion tokens only (the prompt, which holds the system and user turns and the tool
  outputs, is masked) over its number of completion tokens, accumulated in length-sorted
  micro-batches of --micro-batch examples (AdamW on the LoRA weights with weight decay, gradient
  clipping, a constant lr unless --warmup). No replay buffer; a step with nothing accepted makes no
  update, but its rollouts still count.
The filter is RSFT's weigh (which episodes a step trains on, each one's weight in the loss): another weight
algorithm is a subclass that overrides it, registered in WEIGHT_STEPS and named by a method row or --weight-step
(README "Adding a weight algorithm").
After every step the trainer saves itself (adapter, optimizer, scheduler, sampler, RNG, counters) to OUT/ckpt and
the policy serves the new adapter; the step's checkpoint and the rows so far go into the run's store (OUT/store,
lib/run_folder/store.py), the one place a rerun of the same command resumes from, after the last finished step.
OUT/metrics.jsonl holds the rows for a reader. The update's speed against a bare HF loop: scripts/bench_rft.py.
"""
import gc
import json
import os
import random
import shutil
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

import rollout
from lib.backends import ranks
from lib.backends.models import load_model, shared_prefix
from lib.backends.policy import add_backend_args, add_lora, load_lora, load_policy
from lib.cli import Parser, check_out, config_hash, conflicting_flags, inputs_of, one_line_errors, rsft_config
from lib.common.argtypes import nonnegative_float, nonnegative_int, positive_float, positive_int, probability, seed_int
from lib.common.json_files import read_json, write_json, write_jsonl
from lib.episodes import sandbox, switches
from lib.rules import SUCCESS
from lib.run_folder.files import adapter_id, check_same_model, copy_tree, file_sha
from lib.run_folder.store import Store, about, only_command, store_in
from lib.subsets import seeded_sample
from presets import add_preset_arg, parse_with_preset


def add_args(parser):
    """The RSFT, LoRA and sampling flags (whale.py reuses them). The caller adds --model and --seed, and the sandbox's
    switches (rollout.add_sandbox_args)."""
    group = parser.add_argument_group("RSFT rollout step (paper: 256 prompts x G = 8)")
    group.add_argument("--batch", type=positive_int, default=256,
                       help="training prompts per rollout step")
    group.add_argument("--group", type=positive_int, default=8, help="G: rollouts per prompt")
    rollout.add_sampling_args(group)
    group = parser.add_argument_group("SFT update (paper: one pass over the accepted set, one "
                                      "optimizer step per 64 accepted trajectories on each GPU)")
    group.add_argument("--sft-batch", type=positive_int, default=64,
                        help="accepted trajectories per optimizer step (the SFT mini-batch; the "
                             "paper presets: 64 x the official runs' GPUs)")
    group.add_argument("--micro-batch", "--minibatch", type=positive_int, default=8,
                        help="examples per forward/backward inside an SFT mini-batch (gradient "
                             "accumulation)")
    group.add_argument("--lr", type=positive_float, default=1e-4,
                       help="AdamW lr on the LoRA weights")
    group.add_argument("--warmup", type=nonnegative_int, default=0,
                        help="rollout steps of linear lr warm-up (paper: 0, a constant lr)")
    group.add_argument("--weight-decay", type=nonnegative_float, default=0.01,
                       help="AdamW weight decay")
    group.add_argument("--grad-clip", type=nonnegative_float, default=1.0,
                       help="max gradient norm (0 = off)")
    group = parser.add_argument_group("LoRA")
    group.add_argument("--lora-rank", type=positive_int, default=16)
    group.add_argument("--lora-alpha", type=positive_int, default=32)
    group.add_argument("--lora-dropout", type=probability, default=0.0)
    group.add_argument("--lora-targets", default="all-linear",
                       help="'all-linear' or comma-separated module names")
    group = parser.add_argument_group("GPU training")
    group.add_argument("--bf16", action="store_true",
                       help="load the base model in bf16 (LoRA weights stay fp32)")
    group.add_argument("--grad-checkpointing", action="store_true",
                       help="recompute activations in backward")


# -----------------------------------------------------------------------------
# pieces: sampler, loss, update, stop rule

class EpochSampler:
    """Prompt indices in a seeded shuffle, reshuffled every epoch; its state is two integers, so it resumes exactly."""

    def __init__(self, n, seed, epoch=0, pos=0):
        self.n, self.seed, self.epoch, self.pos = n, seed, epoch, pos

    def take(self, k):
        out = []
        while len(out) < k:
            order = random.Random(f"{self.seed}/{self.epoch}").sample(range(self.n), self.n)
            end = min(self.n, self.pos + k - len(out))
            out += order[self.pos:end]
            self.epoch, self.pos = (self.epoch + 1, 0) if end == self.n else (self.epoch, end)
        return out

    @property
    def epochs(self):
        return self.epoch + self.pos / self.n

    def state_dict(self):
        return {"epoch": self.epoch, "pos": self.pos}


def completion_nll(model, examples, weights=None):
    """Summed NLL of the completion tokens of `examples` [(prompt_ids, completion_ids)], in one right-padded batch;
    with `weights` (one per example), each example's NLL times its weight (a weight step's, e.g. an advantage).

    The head runs only on the positions that predict a completion token, so prompt positions (system and user turns,
    tool outputs) neither add to the loss nor cost a vocabulary-sized projection. The leading tokens every example
    shares (models.shared_prefix: the harness's system turn and examples) run once, their keys and values copied to
    every row: the same loss and gradients, the shared part paid once (scripts/bench_rft.py). Not under gradient
    checkpointing, which runs the decoder without a cache, nor with dropout, which would draw one mask for all rows
    there."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    device, decoder = next(model.parameters()).device, base.get_decoder()
    ids = [p + c for p, c in examples]
    prompts = [p for p, _ in examples]
    dropout = model.training and any(isinstance(m, torch.nn.Dropout) and m.p > 0
                                     for m in model.modules())
    plain = dropout or getattr(base, "is_gradient_checkpointing", False)
    shared = 0 if plain else shared_prefix(prompts, base.config)
    cache = None
    if shared:
        cache = decoder(input_ids=torch.tensor([ids[0][:shared]], device=device),
                        use_cache=True).past_key_values
        cache.batch_repeat_interleave(len(examples))  # differentiable: the rows' gradients add up
    width = max(map(len, ids)) - shared
    # pad id is irrelevant: right padding + causal attention
    batch = torch.zeros((len(examples), width), dtype=torch.long)
    targets = torch.full((len(examples), width), -100, dtype=torch.long)
    for i, (p, c) in enumerate(examples):
        batch[i, :len(ids[i]) - shared] = torch.tensor(ids[i][shared:])
        # position t predicts token t + 1; shared < len(p), so all those positions are in `batch`
        targets[i, len(p) - 1 - shared:len(ids[i]) - 1 - shared] = torch.tensor(c)
    batch, targets = batch.to(device), targets.to(device)
    # positions and the causal mask continue from the cache's length
    hidden = decoder(input_ids=batch, past_key_values=cache).last_hidden_state
    keep = targets != -100
    logits = base.get_output_embeddings()(hidden[keep]).float()
    if weights is None:
        return F.cross_entropy(logits, targets[keep], reduction="sum")
    per_token = torch.tensor(weights, dtype=logits.dtype, device=device)[:, None].expand(keep.shape)[keep]
    return (F.cross_entropy(logits, targets[keep], reduction="none") * per_token).sum()


def length_batches(examples, size):
    """Minibatches of similar length (longest first, so an out-of-memory error shows at once)."""
    order = sorted(examples, key=lambda e: len(e[0]) + len(e[1]), reverse=True)
    return [order[i:i + size] for i in range(0, len(order), size)]


def sft_update(model, optimizer, trajectories, sft_batch, micro_batch, grad_clip, weights=None):
    """One SFT pass over the accepted trajectories in order (each a list of examples): one optimizer
    step per mini-batch of `sft_batch` trajectories, its loss the token mean over that mini-batch's
    completion tokens, accumulated over forward/backward micro-batches of `micro_batch` examples.
    Under torchrun each rank runs its share of a mini-batch's trajectories and one all-reduce sums
    the gradients (lib/backends/ranks.py); with one process the share is all of it. `weights`: one per
    trajectory, scaling its tokens' NLL (None: RSFT's plain mean). Returns the mini-batch losses."""
    model.train()
    losses = []
    params = [p for p in model.parameters() if p.requires_grad]
    weights = weights or [None] * len(trajectories)
    # each example carries its trajectory's weight, so that a rank's share keeps it
    weighted = [[(p, c, w) for p, c in t] for t, w in zip(trajectories, weights)]
    for i in range(0, len(weighted), sft_batch):
        mini_batch = weighted[i:i + sft_batch]
        n_tokens = sum(len(c) for t in mini_batch for _, c, _ in t)
        examples = [e for t in ranks.share(mini_batch) for e in t]
        loss = 0.0
        for batch in length_batches(examples, micro_batch):
            scale = None if batch[0][2] is None else [w for _, _, w in batch]
            part = completion_nll(model, [(p, c) for p, c, _ in batch], scale) / n_tokens
            part.backward()
            loss += part.item()
        loss = ranks.sum_gradients(params, loss)
        if grad_clip:
            torch.nn.utils.clip_grad_norm_(params, grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss)
    model.eval()
    return losses


def hand_back_memory():
    """Give the trainer's cached GPU memory back to the driver after an update. PyTorch's caching allocator keeps the
    SFT peak (activations, logits) reserved, and the vLLM engine, another process, must map its whole share again at its
    wake: with both, the card holds the two peaks at once."""
    gc.collect()  # autograd graphs and tensors held by reference cycles first
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def should_stop_weight_phase(rewards, window, min_len, patience):
    """The paper's adaptive rule: stop once the trailing `window`-step mean of the phase's training
    rewards has set no new phase-best (strictly higher) for `patience` steps, and the phase has run
    at least `min_len` steps. The first window-1 means are over the steps so far."""
    if not rewards or len(rewards) < min_len:
        return False
    means = []
    for t in range(len(rewards)):
        recent = rewards[max(0, t - window + 1):t + 1]
        means.append(sum(recent) / len(recent))
    # the first step that reached the best
    best_at = max(range(len(means)), key=lambda t: (means[t], -t))
    return len(means) - 1 - best_at >= patience


def weight_phase_over(rewards, schedule, max_steps, window):
    """Whether the running weight phase ends after these training rewards (one per RSFT step).
    Fixed: after max_steps. Adaptive: when the windowed mean reward has set no new phase-best for
    `window` steps, after at least `window` steps (paper: window = minimum length = patience = 0.2
    epoch), or after max_steps (the weight budget)."""
    if len(rewards) >= max_steps:
        return True
    return schedule == "adaptive" and should_stop_weight_phase(rewards, window, window, window)


def check_batch(batch, n_train, domain_name):
    if not 1 <= batch <= n_train:
        raise ValueError(f"--batch {batch} does not fit the train split of {domain_name} "
                         f"({n_train} prompts): use 1 <= --batch <= {n_train}")


# -----------------------------------------------------------------------------
# the trainer: state that lives across steps (model, optimizer, sampler, counters) and its
# checkpoint

class RSFT:
    """trainer = RSFT(config, policy, domain, folder, train, checkpoint); row = trainer.step(harness_path).
    config: a cli.RSFTConfig.

    The trainer owns the policy's adapter: a fresh LoRA from the seed, or the one of `checkpoint` (a folder save()
    wrote: a store item, copied into `folder` first), with its optimizer, sampler, RNG and counters. After every step
    it saves itself into `folder` and the engine serves that adapter; whoever runs the steps stores the folder
    (whale.weight_phase, rft.train_cli), and a killed run starts again from the store's last step, never from a file of
    its own folder.

    The weight step: RSFT trains on its successful episodes (weigh), each with weight 1. Another weight
    algorithm is a subclass that overrides weigh (which episodes it trains on, each one's weight in the loss),
    registered in WEIGHT_STEPS below under the name a method row gives (README "Adding a weight algorithm")."""

    def __init__(self, cfg, policy, domain, folder, train, checkpoint=None):
        self.cfg, self.policy, self.domain, self.folder, self.train = cfg, policy, domain, Path(folder), train
        policy.to_base()  # the adapter of a trainer before this one goes
        state = {"step": 0, "rollouts": 0, "sampler": {}, "weights": "base"}
        if checkpoint is None:
            torch.manual_seed(cfg.seed)  # the LoRA init
            policy.add_adapter(cfg)
        else:
            shutil.rmtree(self.folder, ignore_errors=True)
            copy_tree(checkpoint, self.folder)
            (self.folder / "key.json").unlink(missing_ok=True)  # the store's record, not the trainer's
            state = read_json(self.folder / "state.json")
            policy.load_adapter(self.folder / "adapter")
        model = policy.model
        if cfg.grad_checkpointing:
            model.get_base_model().gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False})
        model.eval()  # sampling mode; sft_update switches to train mode and back
        self.optimizer, self.scheduler = new_optimizer(model, cfg)
        self.sampler = EpochSampler(len(train), cfg.seed, **state["sampler"])
        self.step_count, self.rollouts = state["step"], state["rollouts"]
        # the weights' id, for the store's keys: "base" until a step updates the adapter (a fresh LoRA's B is zero)
        self.weights_id = state["weights"]
        if checkpoint is not None:
            set_rng_state(load_optimizer(self.folder, self.optimizer, self.scheduler))
            policy.serve_adapter(self.folder / "adapter")  # the engine serves it (canary checked) before any rollout
        # torchrun: the other ranks build the same trainer (rft.follow), from the same checkpoint
        ranks.tell("trainer", (cfg, str(self.folder.resolve()) if checkpoint is not None else None))
        ranks.same_weights(trainable(model))

    @property
    def epoch_progress(self):
        return self.sampler.epochs

    def step(self, harness_path):
        """One rollout step: sample, filter, update; then save and serve the new weights. -> the step's row"""
        tasks = [self.train[i] for i in self.sampler.take(self.cfg.batch)]
        t0 = time.time()
        episodes = self.sample(tasks, harness_path)
        t1 = time.time()
        accepted = [e for e in episodes if e["reward"] > SUCCESS]
        trained = [(examples_of(e), w) for e, w in self.weigh(episodes) if examples_of(e)]
        trajectories = [t for t, _ in trained]
        examples = [e for t in trajectories for e in t]
        lr = self.scheduler.get_last_lr()[0]
        losses = self.update(trajectories, self.loss_weights([w for _, w in trained])) if trajectories else []
        t2 = time.time()
        self.step_count += 1
        self.rollouts += len(episodes)
        row = {
            "step": self.step_count,
            "reward": sum(e["reward"] for e in episodes) / len(episodes),
            "accept_rate": len(accepted) / len(episodes),
            "prompts_accepted": len({e["task_id"] for e in accepted}),
            "examples": len(examples),
            "accepted_tokens": sum(len(c) for _, c in examples),
            "loss": sum(losses) / len(losses) if losses else None,
            "optimizer_steps": len(losses),
            "skipped": not examples,
            "blank": sum(not c["completion"].strip() for e in episodes for c in e["calls"]),
            "errors": sum(e["error"] is not None for e in episodes),
            "rollouts": self.rollouts,
            "epoch": self.epoch_progress,
            "lr": lr,
            "sample_s": round(t1 - t0, 2),
            "train_s": round(t2 - t1, 2),
            "harness": file_sha(harness_path),  # its content: the row reads the same in every run that took it
        }
        self.save(updated=bool(examples))
        self.policy.serve_adapter(self.folder / "adapter")
        return row

    def sample(self, tasks, harness_path):
        """G episodes per task under the harness, each seeded by (seed, step), so a resumed step samples the same."""
        return rollout.run_episodes(
            self.domain, str(harness_path), tasks, self.policy, samples=self.cfg.group,
            **self.cfg.sampling.kwargs(), seed=self.cfg.seed * 1_000_003 + self.step_count,
            desc=f"rft step {self.step_count + 1} rollouts")

    def weigh(self, episodes):
        """[(episode, its weight in the loss)] the step trains on: RSFT keeps every successful one (reward >
        lib/rules.SUCCESS), each with weight 1 (the filter of rejection sampling)."""
        return [(e, 1.0) for e in episodes if e["reward"] > SUCCESS]

    @staticmethod
    def loss_weights(weights):
        """The weights sft_update scales each trajectory's NLL by: None when all are 1 (RSFT's plain mean, the
        same arithmetic as before weight steps existed)."""
        return None if all(w == 1.0 for w in weights) else weights

    def update(self, trajectories, weights=None):
        """ceil(trained / --sft-batch) optimizer steps; the lr schedule steps once per rollout step."""
        self.policy.free_memory()  # vllm --vllm-sleep: the engine's memory goes to the trainer
        # torchrun: the other ranks take their shares of the same update (rft.follow)
        ranks.tell("update", (trajectories, weights))
        losses = sft_update(self.policy.model, self.optimizer, trajectories, self.cfg.sft_batch,
                            self.cfg.micro_batch, self.cfg.grad_clip, weights)
        self.scheduler.step()
        hand_back_memory()  # before the engine wakes (serve_adapter, or the next generate)
        return losses

    def save(self, updated):
        """The trainer into `folder`: adapter, optimizer and scheduler with the RNG, and state.json (the counters, the
        sampler, the weights' id).
        updated: whether this step changed the adapter (else the weights keep their id: "base" stays "base")."""
        shutil.rmtree(self.folder, ignore_errors=True)
        self.policy.save_adapter(self.folder / "adapter")
        if updated:
            self.weights_id = adapter_id(self.folder / "adapter")
        torch.save({"optimizer": self.optimizer.state_dict(),
                    "scheduler": self.scheduler.state_dict(), "rng": get_rng_state()},
                   self.folder / "optimizer.pt")
        state = {"model": self.cfg.model, "weight_step": self.cfg.weight_step, "step": self.step_count,
                 "rollouts": self.rollouts, "sampler": self.sampler.state_dict(), "weights": self.weights_id,
                 "ranks": ranks.count()}
        write_json(self.folder / "state.json", state)


class NoSteps:
    """The trainer of a run whose method makes no weight step (harness-only): the base weights, step 0, no rollouts."""
    step_count = rollouts = 0
    weights_id = "base"


# The weight steps a method row may name (lib/methods.Method.weight_step): name -> a class with RSFT's interface.
# A new weight algorithm is a subclass of RSFT registered here (README "Adding a weight algorithm").
WEIGHT_STEPS = {"rsft": RSFT}


def check_weight_step(name, method=None):
    """A weight step not registered is one line naming the fix, before any model loads."""
    if name not in WEIGHT_STEPS:
        row = f"method {method} names weight step {name!r}" if method else f"--weight-step {name}"
        raise ValueError(f"{row}, which rft.WEIGHT_STEPS does not register (it has {', '.join(WEIGHT_STEPS)}): add "
                         f"WEIGHT_STEPS[{name!r}] = YourStep in rft.py (README \"Adding a weight algorithm\")")


def trainable(model):
    return [p for p in model.parameters() if p.requires_grad]


def new_optimizer(model, cfg):
    """AdamW on the LoRA weights and its lr schedule: a linear warm-up over --warmup rollout steps, then constant."""
    optimizer = torch.optim.AdamW(trainable(model), lr=cfg.lr, weight_decay=cfg.weight_decay)
    warmup = lambda s: min(1.0, (s + 1) / (cfg.warmup + 1))
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, warmup)


def load_optimizer(ckpt, optimizer, scheduler):
    """The checkpoint's optimizer and scheduler state into them. -> the RNG state saved beside them"""
    opt = torch.load(Path(ckpt) / "optimizer.pt", weights_only=False)
    optimizer.load_state_dict(opt["optimizer"])
    scheduler.load_state_dict(opt["scheduler"])
    return opt["rng"]


def follow(model_name, bf16=False, threads=None):
    """A trainer rank other than 0 under torchrun (lib/backends/ranks.py): the base model, then rank 0's commands.
    "trainer": the same trainer RSFT builds, a fresh LoRA from the same seed or rank 0's checkpoint (its folder on the
    shared file system); "update": this rank's share of every SFT mini-batch, the same optimizer steps as rank 0;
    "stop".
    -> the model at the stop (tests compare its weights with rank 0's)"""
    if threads:
        torch.set_num_threads(threads)
    model, _ = load_model(model_name, dtype=torch.bfloat16 if bf16 else None)
    for command, payload in ranks.commands():
        if command == "trainer":
            cfg, ckpt = payload
            if hasattr(model, "get_base_model"):  # the last trainer's adapter off: the base model again
                model = model.unload()
            if ckpt:
                model = load_lora(model, Path(ckpt) / "adapter")
            else:
                torch.manual_seed(cfg.seed)
                model = add_lora(model, cfg)
            if cfg.grad_checkpointing:
                model.get_base_model().gradient_checkpointing_enable(
                    gradient_checkpointing_kwargs={"use_reentrant": False})
            model.eval()
            optimizer, scheduler = new_optimizer(model, cfg)
            if ckpt:
                load_optimizer(ckpt, optimizer, scheduler)
            ranks.same_weights(trainable(model))
        elif command == "update":
            trajectories, weights = payload
            sft_update(model, optimizer, trajectories, cfg.sft_batch, cfg.micro_batch, cfg.grad_clip, weights)
            scheduler.step()
            hand_back_memory()
    return model


def examples_of(episode):
    """The SFT examples of one episode: (prompt ids, sampled completion ids) of each llm() call that sampled any."""
    return [(c["prompt_ids"], c["completion_ids"]) for c in episode["calls"] if c["completion_ids"]]


def get_rng_state():
    return {"torch": torch.get_rng_state(), "python": random.getstate(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def set_rng_state(state):
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# -----------------------------------------------------------------------------

def main(argv=None):
    # here, not at the top: the SFT update (scripts/gpu_check.sh) needs no domain, nor python-chess
    import domains
    ranks.set_device()  # this rank's card before anything reads one (the preflight, the model)
    p = Parser(description="Online RSFT with LoRA (the weight phase of WHALE).", short_help=True)
    # run
    p.add_argument("--domain", choices=list(domains.DOMAINS))
    p.add_argument("--harness", help="the harness file the rollouts run under")
    p.add_argument("--model", default="smoke", help="smoke | cpu | null (replies '' to every call) | hub id | local path")
    p.add_argument("--out", help="run folder: config.json, metrics.jsonl, ckpt/, store/, summary.json")
    p.add_argument("--steps", type=positive_int, default=10,
                   help="rollout steps in all (a rerun resumes)")
    p.add_argument("--seed", type=seed_int, default=0)
    p.add_argument("--train-limit", type=positive_int, default=None,
                   help="draw the prompts from a seeded sample of N train tasks (as whale.py's --train-limit)")
    p.add_argument("--weight-step", default="rsft",
                   help=f"the weight algorithm, a name in rft.WEIGHT_STEPS ({', '.join(WEIGHT_STEPS)}; whale.py: the "
                        "method row's)")
    add_preset_arg(p)
    # adaptive stop (paper: window = minimum phase length = patience = 0.2 epoch)
    p.add_argument("--stop-patience", type=nonnegative_int, default=0,
                   help="stop early when the N-step mean reward set no new best for N steps, after "
                        "N steps (0 = off)")
    add_args(p)  # named in --help, listed in --help-all
    add_backend_args(p)
    domains.add_args(p)
    rollout.add_sandbox_args(p)
    args = parse_with_preset(p, argv)  # the preset's defaults, any flag given over them
    if not (args.domain and args.harness and args.out):
        p.error("--domain, --harness and --out are required")
    if conflicting_flags(args):
        p.error(conflicting_flags(args))
    if ranks.rank():  # under torchrun, a rank other than 0: its share of every update
        preflight(args)  # its card's checks, before the model loads
        with ranks.following("rft.py", args.model, args.out):
            follow(args.model, args.bf16)
        return
    with one_line_errors("rft.py"), ranks.leading(args.model, args.out):  # rank 0 of torchrun: the steps as one process
        train_cli(args)


def preflight(args, domains=None):
    """What plan.py --check checks for this launch, as for a run of whale.py that trains weights only
    (lib/ops/preflight.launch): on rank 0 (given `domains`) everything, on the other ranks the card each trains on;
    before any model loads. One process
    on a machine without a GPU has no card to check, and its own checks (domains.check_inputs) read the inputs the
    preflight reads: it runs none."""
    if not (torch.cuda.is_available() or ranks.count() > 1):
        return
    from lib.ops import preflight
    if domains is None:
        preflight.launch([args], "rft.py")
    else:
        preflight.launch([args], "rft.py", domains.check_harness, domains.from_args)


def train_cli(args):
    """rft.py's run: every check before the model loads (the first thing to hear about is a bad input), then RSFT
    steps until --steps or the early stop. Its progress lives in a store in the run folder (OUT/store): the
    checkpoint after every step under the key of the run's settings, harness and rank count, found again by a
    rerun, which goes on from it (another --steps goes on from the same steps)."""
    import domains
    rollout.apply_args(args)  # first: --threads auto's choice is the run's first line
    sandbox.apply_args(args)
    check_out(args.out)
    check_same_model(args.out, args.model)  # its steps so far were another model's: refused, not started over
    ranks.check_launch(args.backend)
    domain, train = domains.check_inputs(args, "train")
    if args.train_limit:  # as whale.py draws its prompts
        train = seeded_sample(train, args.train_limit)
    check_batch(args.batch, len(train), domain.name)
    check_weight_step(args.weight_step)
    preflight(args, domains)
    cfg = rsft_config(args, inputs_of(args, domains.data_flags()))
    store = Store(store_in(args.out, unconfined=switches.disabled()))
    with only_command(store_in(args.out), store.root):  # a second command on this folder is refused in one line
        run_steps(args, cfg, store, domain, train)


def run_steps(args, cfg, store, domain, train):
    """rft.py's steps, from the store's last one under this key (the settings, the harness, the rank count): RSFT
    steps until --steps or the early stop, each put in the store, then summary.json."""
    key = {"config": config_hash(cfg), "harness": file_sha(args.harness), "ranks": ranks.count()}
    item = store.find("weights", key)
    rows = about(item)["rows"] if item else []
    if item is None and Path(args.out, "metrics.jsonl").exists():  # not silently: its rows are rewritten below
        print(f"rft.py: {args.out}/store holds no step of these settings, harness and code: training from step 0")
    trainer = WEIGHT_STEPS[cfg.weight_step](cfg, load_policy(args), domain, Path(args.out, "ckpt"), train, item)
    os.makedirs(args.out, exist_ok=True)
    write_json(Path(args.out, "config.json"), vars(args))

    write_jsonl(Path(args.out, "metrics.jsonl"), rows)  # the steps so far, for a reader (the store is the truth)
    n = args.stop_patience
    bar = tqdm(total=args.steps, initial=trainer.step_count, desc="rft steps")
    while trainer.step_count < args.steps and not (
            n and should_stop_weight_phase([r["reward"] for r in rows], n, n, n)):
        row = trainer.step(args.harness)
        rows.append(row)
        store.put("weights", key, trainer.folder, about={"rows": rows})
        write_jsonl(Path(args.out, "metrics.jsonl"), rows)
        bar.update(1)
        bar.set_postfix(reward=f"{row['reward']:.3f}", accept=f"{row['accept_rate']:.2f}",
                        loss="skip" if row["skipped"] else f"{row['loss']:.3f}",
                        rollouts=row["rollouts"])
    bar.close()
    rewards = [r["reward"] for r in rows]
    summary = {"steps": trainer.step_count, "rollouts": trainer.rollouts,
               "epochs": trainer.epoch_progress, "rewards": rewards,
               "first_reward": rewards[0] if rewards else None,
               "last_reward": rewards[-1] if rewards else None,
               "stopped_early": trainer.step_count < args.steps,
               "seconds": sum(r["sample_s"] + r["train_s"] for r in rows),
               "adapter": os.path.join(args.out, "ckpt", "adapter"), "verifier": domain.verifier(),
               "scoring": domain.scoring_rule(),
               "trainer_ranks": ranks.count()}
    write_json(Path(args.out, "summary.json"), summary)
    print(json.dumps({k: v for k, v in summary.items() if k != "rewards"}))


if __name__ == "__main__":
    main()
