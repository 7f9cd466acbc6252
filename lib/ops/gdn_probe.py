"""The Gated DeltaNet probe the preflight runs on the GPU, in a process of its own (a kernel that crashes takes its
CUDA context with it): the kernel transformers runs for Qwen3.5's Gated DeltaNet layers (fla-core's
chunk_gated_delta_rule where it imports, else transformers' torch loop), forward and backward in bf16 at the 2B
model's head shapes, against transformers' own torch reference in fp32 on the same inputs (the function the
kernel hub wraps, torch_chunk_gated_delta_rule.__wrapped__ in transformers 5.20.2). The sequence crosses
several 64-token chunks, so an error in the state carried from chunk to chunk shows. Finite is not enough: this
kernel family has shipped wrong but finite gradients on Hopper (fla-core issues #640, #984, #1241), on which LoRA
would train all night.

    python -m lib.ops.gdn_probe       # prints the kernel (the function transformers calls, by its module) and its
                                      # largest relative error; exit 1 above BOUND, or where fla-core is installed
                                      # but transformers fell back to its torch loop

    errors = relative_errors(kernel, reference, device="cpu")   # {"out": e, "q": e, ...}: what the test calls
"""
import importlib.util
import inspect
import sys

import torch

SHAPE = (1, 512, 16, 128)  # batch, tokens (8 chunks of 64), heads, head size: the 2B model's Gated DeltaNet layers
CHUNK = 64  # the chunk both kernels step through the sequence by
# the largest relative error (||fast - reference|| / ||reference||, per tensor) a right kernel shows: bf16 inputs and
# outputs against an fp32 reference differ by a few 1e-3 (fla-core's own tests allow 5e-3 to 2e-2 per gradient at
# these sizes); a wrong gradient is off by tens of percent or more
BOUND = 0.05
NAMES = ("q", "k", "v", "g", "beta")


FLA_MODULE = "fla.ops.gated_delta_rule"  # where transformers imports fla-core's kernel from (hub_kernels' mapping)


def kernels():
    """(the kernel transformers runs, its torch reference, the name of the function it actually calls: its own
    module's)."""
    from transformers.models.qwen3_5 import modeling_qwen3_5
    fast = modeling_qwen3_5.torch_chunk_gated_delta_rule
    bound = bound_kernel(fast)
    return fast, inspect.unwrap(fast), f"{bound.__module__}.{bound.__qualname__}"


def bound_kernel(fast):
    """The function transformers' wrapper calls: transformers 5.20.2's use_kernel_func_from_hub_with_fallback
    (integrations/hub_kernels.py) binds fla-core's where `fla.ops.gated_delta_rule` imports and its own torch function
    where the import fails, without a word, and keeps it in the wrapper's closure as `implementation`."""
    f, seen = fast, set()
    while f is not None and id(f) not in seen:
        seen.add(id(f))
        cells = dict(zip(f.__code__.co_freevars, (c.cell_contents for c in f.__closure__ or ())))
        if callable(cells.get("implementation")):
            return cells["implementation"]
        f = getattr(f, "__wrapped__", None)
    return fast


def fallback_line(fast, reference):
    """The line that fails the probe where fla-core is installed but transformers bound its torch loop (the probe would
    compare torch with torch, and the trainer run the slow loop all night); None otherwise (without fla-core the torch
    loop is what trains, knowingly)."""
    if bound_kernel(fast) is not reference or importlib.util.find_spec("fla") is None:
        return None
    try:
        importlib.import_module(FLA_MODULE)
        why = "it imports now, but did not when transformers bound the kernel"
    except Exception as e:  # what transformers swallowed
        why = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:300]
    return (f"fla-core is installed, but transformers runs its torch loop for the Gated DeltaNet layers: {FLA_MODULE} "
            f"does not import ({why})")


def probe_inputs(shape, device, seed=0):
    """q, k, v, g, beta as a Gated DeltaNet layer hands them to the kernel, in fp32: the decay g (log space, <= 0)
    slow on some heads and fast on others, so that the state carried across chunks matters."""
    gen = torch.Generator().manual_seed(seed)
    batch, tokens, heads, size = shape
    q, k, v = (torch.randn(shape, generator=gen) for _ in range(3))
    rate = torch.logspace(-3, 0, heads)  # per head: from a state kept over thousands of tokens to a few
    g = -torch.rand((batch, tokens, heads), generator=gen) * rate
    beta = torch.rand((batch, tokens, heads), generator=gen)
    return [t.to(device) for t in (q, k, v, g, beta)]


def forward_backward(kernel, inputs, dtype, upstream):
    """The kernel's output and its gradients with respect to q, k, v, g and beta, from `upstream` (the output's
    gradient), with q, k, v and beta in `dtype` (g stays fp32, as the model hands it over)."""
    leaves = [t.to(dtype if name != "g" else torch.float32).detach().requires_grad_()
              for name, t in zip(NAMES, inputs)]
    q, k, v, g, beta = leaves
    out, _ = kernel(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True)
    out.backward(upstream.to(out.dtype))
    return {"out": out.detach().float(), **{name: t.grad.float() for name, t in zip(NAMES, leaves)}}


def relative_errors(kernel, reference, device="cuda", dtype=torch.bfloat16, shape=SHAPE, seed=0):
    """{tensor: ||kernel's - reference's|| / ||reference's||} for the output and each input's gradient: `kernel` in
    `dtype`, `reference` in fp32, on the same inputs and the same upstream gradient."""
    inputs = probe_inputs(shape, device, seed)
    upstream = torch.randn(shape[:3] + (shape[3],), generator=torch.Generator().manual_seed(seed + 1)).to(device)
    fast = forward_backward(kernel, inputs, dtype, upstream)
    ref = forward_backward(reference, inputs, torch.float32, upstream)
    return {name: float((fast[name] - ref[name]).norm() / ref[name].norm().clamp_min(1e-30)) for name in ref}


def verdict(errors, name, tokens=SHAPE[1]):
    """(ok, one line): the largest error of a comparison over `tokens` against BOUND; a non-finite one fails too."""
    worst = max(errors, key=lambda k: errors[k] if errors[k] == errors[k] else float("inf"))
    shown = ", ".join(f"{k} {v:.1e}" for k, v in errors.items())
    ok = all(v <= BOUND for v in errors.values())  # NaN compares False: a non-finite gradient fails
    what = "within" if ok else f"{'d' + worst if worst != 'out' else 'the output'} off by more than"
    return ok, (f"{name} in bf16 against transformers' fp32 reference over {tokens} tokens ({tokens // CHUNK} "
                f"chunks): relative errors {shown}: {what} {BOUND:g}")


def main():
    fast, reference, name = kernels()
    fallback = fallback_line(fast, reference)
    if fallback:
        print(fallback, file=sys.stderr)
        return 1
    ok, line = verdict(relative_errors(fast, reference, "cuda"), name)
    torch.cuda.synchronize()
    print(line, file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
