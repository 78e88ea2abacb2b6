"""An EAGLE-3 head's step as one native call (models/eagle_native.py, kernels/layer.c's
specdecode_eagle3_layer): every kind of step a proposal runs (a bulk feed, a ragged batch of pending
entries, a tree level under a visibility mask) gives the output and the cache entries of the module
path, bit for bit, for int4 and int8 heads with either residual; and the step runs natively only
where it may."""
from __future__ import annotations

import pytest
import torch

from specdecode.kernels import native_kernels
from specdecode.models import eagle_native
from specdecode.runtime.attention import backend
from specdecode.runtime.context import Context, use_context
from specdecode.runtime.kv_cache import KVCache
from test_eagle import random_head, target

pytestmark = pytest.mark.skipif(native_kernels() is None, reason="native kernels unavailable here")


def _head(fmt: str, norm_before_residual: bool):
    m = target().float()
    head = random_head(m, norm_before_residual=norm_before_residual).float()
    return head.quantize(fmt).bind(m)


def _cache(head, prefix: list[int]) -> KVCache:
    """The head's cache with a random prefix of entries per slot (the same for every call)."""
    c = head.cfg
    kv = KVCache(1, len(prefix), 64, c.num_kv_heads, c.head_dim, torch.float32)
    g = torch.Generator().manual_seed(5)
    kv.k.copy_(torch.randn(kv.k.shape, generator=g))
    kv.v.copy_(torch.randn(kv.v.shape, generator=g))
    for slot, n in enumerate(prefix):
        kv.set_length(slot, n)
    return kv


@torch.inference_mode()
def _steps(head, attention):
    """The steps of a proposal (as it runs them: in inference mode), each on a cache of its own;
    returns the output rows and the entries written."""
    c, g = head.cfg, torch.Generator().manual_seed(7)
    H, out = c.hidden_size, []

    def step(prefix, num_new, mask=None):
        kv = _cache(head, prefix)
        B, T = len(prefix), max(num_new)
        ids = torch.randint(0, c.vocab_size, (B, T), generator=g)
        hidden = torch.randn(B, T, H, generator=g)
        pos = torch.tensor([[p + t for t in range(T)] for p in prefix])
        ctx = Context(kv, list(range(B)), list(prefix), list(num_new), attn_mask=mask, backend=attention)
        with use_context(ctx, torch.device("cpu")):
            x = head.step(head.embed(ids), hidden, pos)
        for b, (p, n) in enumerate(zip(prefix, num_new)):
            out.extend([x[b, :n], kv.k[0, b, :, p:p + n], kv.v[0, b, :, p:p + n]])

    step([0], [9])  # a prompt's entries fed in bulk
    step([5, 11], [1, 3])  # pending entries of two sequences (ragged: the first pads)
    tree = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=torch.bool)
    mask = torch.cat([torch.ones(4, 6, dtype=torch.bool), tree], 1)[None, None]  # [1, 1, T, prefix + T]
    step([6], [4], mask)  # a tree level: each node sees the prefix and its ancestors
    return out


@pytest.mark.parametrize("fmt", ["int4", "int8"])
@pytest.mark.parametrize("norm_before_residual", [False, True])
def test_native_step_gives_the_bits_of_the_module_path(fmt, norm_before_residual, monkeypatch):
    head = _head(fmt, norm_before_residual)
    real, ran = eagle_native.NativeStep.step, []

    def counting(self, *args):
        got = real(self, *args)
        ran.append(got is not None)
        return got

    monkeypatch.setattr(eagle_native.NativeStep, "step", counting)
    fused = _steps(head, backend("cpu-native"))
    assert ran == [True] * 3
    monkeypatch.setattr(eagle_native.NativeStep, "step", lambda *a, **k: None)
    modules = _steps(head, backend("cpu-native"))
    assert len(fused) == len(modules)
    for a, b in zip(fused, modules):
        assert torch.equal(a, b)


def test_native_step_runs_only_where_it_may():
    """Float weights (training), another attention backend or autograd (where the module path keeps
    PyTorch's norms for a weight that wants a gradient) take the modules."""
    m = target().float()
    ctx_for = lambda attention: Context(_cache(head, [3]), [0], [3], [1], backend=attention)  # noqa: E731
    x, e, pos = torch.randn(1, 1, m.cfg.hidden_size), torch.randn(1, 1, m.cfg.hidden_size), torch.tensor([[3]])
    head = random_head(m).float().bind(m)
    step = head._native.step
    with torch.no_grad():
        assert step(head, ctx_for(backend("cpu-native")), e, x, pos) is None  # float projections
        head.quantize("int4")
        assert step(head, ctx_for(backend("cpu-native")), e, x, pos) is not None
        assert step(head, ctx_for(backend("torch-sdpa")), e, x, pos) is None
    assert step(head, ctx_for(backend("cpu-native")), e, x, pos) is None
