"""
The RSFT update's speed: rft.sft_update against a bare HF forward/backward loop on the same minibatches and
adapter, best of --repeats, interleaved. Prints tokens/s of both and "ratio = X" (1.0: the update costs no more
than the bare loop; docs/cpu-run/README.md quotes the measured ratios). With --shared-tokens N every example
opens with the same N tokens (a harness's system turn and examples), and it also times the update with that
opening run per row (rft.shared_prefix off): "opening speedup = X".

    python scripts/bench_rft.py --model smoke
    python scripts/bench_rft.py --model cpu --micro-batch 2
    python scripts/bench_rft.py --model cpu --shared-tokens 120
"""
import argparse
import os
import random
import sys
import time

import torch
from tqdm import tqdm

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import rft  # noqa: E402
from lib.backends.models import MIN_SHARED_PREFIX, load_model  # noqa: E402
from lib.backends.policy import add_lora  # noqa: E402
from rft import length_batches, sft_update  # noqa: E402


def bench(args, repeats=5):
    torch.manual_seed(args.seed)
    model, _ = load_model(args.model, dtype=torch.bfloat16 if args.bf16 else None)
    model = add_lora(model, args)
    if args.grad_checkpointing:
        model.get_base_model().gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    vocab = model.config.vocab_size
    rng = random.Random(args.seed)
    opening = [rng.randrange(vocab) for _ in range(args.shared_tokens)]
    examples = [(opening + [rng.randrange(vocab) for _ in range(rng.randint(64, 384))],
                 [rng.randrange(vocab) for _ in range(rng.randint(16, 128))]) for _ in range(4 * args.micro_batch)]
    n_tokens = sum(len(p) + len(c) for p, c in examples)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr)
    device = next(model.parameters()).device
    padded = []  # the bare loop gets the same minibatches, already padded, with HF's own labels loss
    for batch in length_batches(examples, args.micro_batch):
        width = max(len(p) + len(c) for p, c in batch)
        ids = torch.zeros((len(batch), width), dtype=torch.long)
        labels = torch.full_like(ids, -100)
        for i, (p, c) in enumerate(batch):
            ids[i, :len(p) + len(c)] = torch.tensor(p + c)
            labels[i, len(p):len(p) + len(c)] = torch.tensor(c)
        padded.append((ids.to(device), labels.to(device)))

    def rsft():
        sft_update(model, optimizer, [examples], len(examples), args.micro_batch, args.grad_clip)  # one step

    def per_row():  # the same update with the shared opening run in every row
        shared_prefix, rft.shared_prefix = rft.shared_prefix, lambda *a: 0
        try:
            rsft()
        finally:
            rft.shared_prefix = shared_prefix

    def bare():
        model.train()
        for ids, labels in padded:
            model(input_ids=ids, labels=labels).loss.backward()
        optimizer.zero_grad(set_to_none=True)

    def timed(fn):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t

    rsft()  # warm up both
    bare()
    sides = {"rsft": rsft, "bare": bare, **({"per_row": per_row} if args.shared_tokens else {})}
    times = {k: [] for k in sides}
    for _ in tqdm(range(repeats), desc="bench"):  # interleaved, best of N: robust to a busy machine
        for k, fn in sides.items():
            times[k].append(timed(fn))
    speed = {k: n_tokens / min(v) for k, v in times.items()}
    print(f"model {args.model}, LoRA rank {args.lora_rank}, {len(examples)} examples, {n_tokens} tokens, "
          f"micro_batch {args.micro_batch}, device {device.type}, best of {repeats}")
    print(f"rsft update (sft_update):        {speed['rsft']:10.0f} tokens/s")
    print(f"bare forward/backward (HF loss): {speed['bare']:10.0f} tokens/s")
    print(f"ratio = {speed['rsft'] / speed['bare']:.2f}")
    if args.shared_tokens:
        print(f"opening of {args.shared_tokens} tokens run per row: {speed['per_row']:10.0f} tokens/s")
        print(f"opening speedup = {speed['rsft'] / speed['per_row']:.2f}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smoke", help="smoke | cpu | null (replies '' to every call) | hub id | local path")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--shared-tokens", type=int, default=0,
                   help="the opening every example shares (0: none, the bench as before)")
    rft.add_args(p)
    args = p.parse_args(argv)
    if args.shared_tokens and (args.shared_tokens < MIN_SHARED_PREFIX or args.grad_checkpointing):
        p.error(f"--shared-tokens {args.shared_tokens}: the update shares an opening of at least "
                f"{MIN_SHARED_PREFIX} tokens, and none under --grad-checkpointing; give more, or drop one")
    bench(args, repeats=args.repeats)


if __name__ == "__main__":
    main()
