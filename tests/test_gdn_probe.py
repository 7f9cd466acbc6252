"""The Gated DeltaNet probe's comparison (lib/ops/gdn_probe.py), on the CPU: a kernel against transformers' fp32 torch
reference on the same inputs passes when it is the reference (in bf16) and fails when its backward is wrong, as the
preflight's probe does on the GPU with fla-core's kernel. Small head shapes here; the probe runs the 2B model's."""
import sys
import types

import pytest
import torch

from lib.ops import gdn_probe

SHAPE = (1, 256, 4, 32)  # 4 chunks of 64 tokens


def wrong_backward(reference, spoil):
    """A kernel whose forward is the reference's and whose backward is spoiled by `spoil(grads)`: wrong but finite
    gradients, as fla-core's backward has shipped on Hopper (its issues #640, #984, #1241)."""
    class Kernel(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, g, beta):
            ctx.save_for_backward(q, k, v, g, beta)
            with torch.no_grad():
                return reference(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True)[0]

        @staticmethod
        def backward(ctx, upstream):
            leaves = [t.detach().requires_grad_() for t in ctx.saved_tensors]
            with torch.enable_grad():
                q, k, v, g, beta = leaves
                out = reference(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True)[0]
                grads = dict(zip(gdn_probe.NAMES, torch.autograd.grad(out, leaves, upstream)))
            spoil(grads)
            return tuple(grads[name] for name in gdn_probe.NAMES)

    return lambda q, k, v, g, beta, **kw: (Kernel.apply(q, k, v, g, beta), None)


def zero_past_first_chunk(name):
    def spoil(grads):
        grads[name] = grads[name].clone()
        grads[name][:, gdn_probe.CHUNK:] = 0
    return spoil


def scale(name, factor):
    def spoil(grads):
        grads[name] = grads[name] * factor
    return spoil


@pytest.fixture(scope="module")
def kernels():
    fast, reference, name = gdn_probe.kernels()
    assert reference is not fast and reference.__name__ == "torch_chunk_gated_delta_rule"  # the hub's wrapper undone
    return fast, reference, name


def test_the_reference_in_bf16_passes_and_its_errors_are_bf16s(kernels):
    """The reference itself as the kernel under test (fla-core's, where installed, runs on the GPU only)."""
    _, reference, name = kernels
    errors = gdn_probe.relative_errors(reference, reference, "cpu", shape=SHAPE)
    assert set(errors) == {"out", *gdn_probe.NAMES}
    assert all(0 < e < gdn_probe.BOUND / 5 for e in errors.values()), errors  # bf16 rounding, well within the bound
    ok, line = gdn_probe.verdict(errors, name, SHAPE[1])
    assert ok and "over 256 tokens (4 chunks)" in line and line.endswith(f"within {gdn_probe.BOUND:g}")


@pytest.mark.parametrize("tensor,spoil", [("g", zero_past_first_chunk("g")), ("k", zero_past_first_chunk("k")),
                                          ("beta", scale("beta", 1.3))])
def test_a_kernel_with_a_wrong_backward_fails_naming_the_gradient(kernels, tensor, spoil):
    _, reference, _ = kernels
    errors = gdn_probe.relative_errors(wrong_backward(reference, spoil), reference, "cpu", shape=SHAPE)
    ok, line = gdn_probe.verdict(errors, "a wrong kernel", SHAPE[1])
    assert not ok and errors[tensor] > gdn_probe.BOUND and f"d{tensor} off by more than" in line
    assert errors["out"] < gdn_probe.BOUND  # the forward is right: only the gradients show it


def test_an_error_past_the_first_chunk_needs_a_probe_longer_than_one_chunk(kernels):
    """Why the probe crosses several chunks: a backward wrong only in the state carried between chunks passes a
    one-chunk probe."""
    _, reference, _ = kernels
    wrong = wrong_backward(reference, zero_past_first_chunk("g"))
    one_chunk = gdn_probe.relative_errors(wrong, reference, "cpu", shape=(1, gdn_probe.CHUNK, 4, 32))
    assert gdn_probe.verdict(one_chunk, "a wrong kernel")[0]
    assert gdn_probe.SHAPE[1] >= 4 * gdn_probe.CHUNK


def test_a_gradient_that_is_not_finite_fails(kernels):
    _, reference, _ = kernels
    errors = gdn_probe.relative_errors(wrong_backward(reference, scale("v", float("nan"))), reference, "cpu",
                                       shape=SHAPE)
    assert not gdn_probe.verdict(errors, "a wrong kernel")[0]


def hub_wrapped(monkeypatch, fla):
    """transformers' own wrapper (hub_kernels.use_kernel_func_from_hub_with_fallback, as modeling_qwen3_5 applies it)
    around a torch function, with `fla` standing in for fla-core's package (a module object, or None for none)."""
    from transformers.integrations.hub_kernels import use_kernel_func_from_hub_with_fallback
    if fla is not None:
        monkeypatch.setitem(sys.modules, "fla", fla)
    monkeypatch.setattr(gdn_probe.importlib.util, "find_spec", lambda name: object() if fla is not None else None)

    def torch_chunk_gated_delta_rule(q, k, v, g=None, beta=None, use_qk_l2norm_in_kernel=False):
        return q, None
    fast = use_kernel_func_from_hub_with_fallback("chunk_gated_delta_rule", "fla")(torch_chunk_gated_delta_rule)
    return fast, torch_chunk_gated_delta_rule


def test_the_probe_names_the_function_transformers_bound_by_its_module(monkeypatch):
    """fla-core's kernel where transformers bound it; where fla-core is installed but its kernel did not import,
    transformers' wrapper falls back to its torch loop without a word: the probe names that loop and fails (main's
    exit 1, before any kernel runs), naming the import error; without fla-core the torch loop is what trains."""
    fla, ops, gdr = (types.ModuleType(n) for n in ("fla", "fla.ops", "fla.ops.gated_delta_rule"))
    def chunk_gated_delta_rule(q, k, v, g=None, beta=None, use_qk_l2norm_in_kernel=False):
        return q, None
    chunk_gated_delta_rule.__module__ = "fla.ops.gated_delta_rule.chunk"
    gdr.chunk_gated_delta_rule, ops.gated_delta_rule, fla.ops, fla.__path__ = chunk_gated_delta_rule, gdr, ops, []
    for name, module in (("fla.ops", ops), ("fla.ops.gated_delta_rule", gdr)):
        monkeypatch.setitem(sys.modules, name, module)
    fast, reference = hub_wrapped(monkeypatch, fla)
    assert gdn_probe.bound_kernel(fast) is chunk_gated_delta_rule
    assert gdn_probe.fallback_line(fast, reference) is None
    # fla-core installed, its kernel's import broken (a triton it was not built for, say)
    broken = types.ModuleType("fla")
    for name in ("fla.ops", "fla.ops.gated_delta_rule"):
        monkeypatch.delitem(sys.modules, name)
    fast, reference = hub_wrapped(monkeypatch, broken)
    assert gdn_probe.bound_kernel(fast) is reference
    line = gdn_probe.fallback_line(fast, reference)
    assert line.startswith("fla-core is installed, but transformers runs its torch loop for the Gated DeltaNet "
                           "layers: fla.ops.gated_delta_rule does not import (ModuleNotFoundError: No module named "
                           "'fla.ops'"), line
    name = f"{reference.__module__}.{reference.__qualname__}"
    monkeypatch.setattr(gdn_probe, "kernels", lambda: (fast, reference, name))
    assert gdn_probe.main() == 1
    # no fla-core at all: the torch loop, named as such, and no failure for it
    monkeypatch.delitem(sys.modules, "fla")
    fast, reference = hub_wrapped(monkeypatch, None)
    assert gdn_probe.bound_kernel(fast) is reference and gdn_probe.fallback_line(fast, reference) is None


def test_the_probe_names_what_this_machine_binds(kernels):
    """Here (no fla-core): transformers' own torch loop, by its module and name."""
    fast, reference, name = kernels
    assert name == "transformers.models.qwen3_5.modeling_qwen3_5.torch_chunk_gated_delta_rule"
