"""The cpu-native attention backend (kernels/attention.c): the same attention as PyTorch's SDPA, and
the same bits for a query however it is batched: alone, in a chunk, in a batch with padding, as a
tree node (which must equal the decode of its path), on the AVX512 and the AVX2 body alike."""
from __future__ import annotations

import pytest
import torch

from specdecode.kernels import load_native_kernels, native_kernels
from specdecode.runtime import attention
from specdecode.runtime.context import Context, use_context
from specdecode.runtime.kv_cache import KVCache

H, HKV, D, LAYERS = 6, 2, 64, 2

pytestmark = pytest.mark.skipif(native_kernels() is None, reason="native kernels unavailable here")


def _cache(dtype, slots=4, max_len=96):
    kv = KVCache(LAYERS, slots, max_len, HKV, D, dtype)
    g = torch.Generator().manual_seed(0)
    for s in range(slots):  # a committed prefix of 40 random tokens in every slot
        k, v = torch.randn(1, HKV, 40, D, generator=g), torch.randn(1, HKV, 40, D, generator=g)
        kv.write(1, k, v, [s], [0], [40], 40)
        kv.set_length(s, 40)
    return kv


def _forward(name, kv, slots, starts, qkv, tree_mask=None, layer=1):
    """One attention call of backend ``name`` over new tokens qkv = (q [B, H, T, D], k, v [B, HKV, T, D])."""
    num_new = [int(n) for n in qkv[3]]
    ctx = Context(kv, slots, starts, num_new, tree_mask)
    with use_context(ctx, torch.device("cpu")):
        return attention.backend(name).forward(layer, *qkv[:3], ctx)


def _new(B, T, seed, num_new=None):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, T, D, generator=g), torch.randn(B, HKV, T, D, generator=g),
            torch.randn(B, HKV, T, D, generator=g), num_new or [T] * B)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_sdpa(dtype):
    """Decode, a causal chain, a padded batch with different starts, and a tree: within rounding of
    PyTorch's SDPA (which attends in the cache's type: bfloat16 queries for a bfloat16 cache)."""
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    tree = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=torch.bool)
    cases = [([0], [40], _new(1, 1, 1), None), ([1], [40], _new(1, 7, 2), None),
             ([0, 2, 3], [40, 12, 33], _new(3, 5, 3, [5, 2, 4]), None), ([3], [40], _new(1, 4, 4), tree[None])]
    for slots, starts, qkv, tm in cases:
        kv = _cache(dtype)
        for s, L in zip(slots, starts):
            kv.set_length(s, L)
        got = _forward("cpu-native", kv, slots, starts, qkv, tm)
        want = _forward("torch-sdpa", kv, slots, starts, qkv, tm)
        for b, n in enumerate(qkv[3]):  # padded query rows are unspecified
            torch.testing.assert_close(got[b, :, :n], want[b, :, :n].float(), atol=tol, rtol=tol)


def test_same_bits_however_batched():
    """Each query of a 3-row padded batched chunk equals, bit for bit, a one-token decode of it with
    only its own keys; a tree node equals the decode of its path."""
    kv = _cache(torch.bfloat16)
    slots, starts, q, k, v, num_new = [0, 2, 3], [40, 12, 33], *_new(3, 5, 3, [5, 2, 4])
    batched = _forward("cpu-native", kv, slots, starts, (q, k, v, num_new))
    for b, (s, L, n) in enumerate(zip(slots, starts, num_new)):
        for t in range(n):  # the row's earlier new tokens are in the cache (written by the batched call)
            kv.set_length(s, L + t)
            one = _forward("cpu-native", kv, [s], [L + t], (q[b:b + 1, :, t:t + 1], k[b:b + 1, :, t:t + 1],
                                                           v[b:b + 1, :, t:t + 1], [1]))
            assert torch.equal(one[0, :, 0], batched[b, :, t]), (b, t)

    kv = _cache(torch.bfloat16)  # tree: root, a (root's child), c (root's child), d (c's child)
    tree = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=torch.bool)[None]
    q, k, v, _ = _new(1, 4, 5)
    nodes = _forward("cpu-native", kv, [1], [40], (q, k, v, [4]), tree)
    path = [0, 2, 3]  # decode root, c, d as a chain
    chain = _forward("cpu-native", kv, [1], [40], (q[:, :, path], k[:, :, path], v[:, :, path], [3]))
    assert torch.equal(nodes[0, :, path], chain[0])


@pytest.mark.parametrize("heads,kv_heads,dim", [(6, 6, 64), (4, 2, 72), (9, 3, 64), (12, 2, 128), (14, 2, 40),
                                               (10, 2, 64)])
def test_each_query_of_a_long_chunk_equals_its_decode(heads, kv_heads, dim):
    """The kernel works on a task of several tokens x the query heads of one kv head, sharing each
    block of keys and values between them and computing queries in pairs: every query still gets
    the bits of a one-query call seeing the same keys, for odd and even heads per kv head, head dims
    that are not a multiple of 32, chunks longer than a task and a visibility mask."""
    g = torch.Generator().manual_seed(heads * dim)
    B, T, L = 2, 40, 160
    kc = torch.randn(3, kv_heads, L, dim, generator=g).to(torch.bfloat16)
    vc = torch.randn(3, kv_heads, L, dim, generator=g).to(torch.bfloat16)
    q = torch.randn(B, heads, T, dim, generator=g)
    slots = torch.tensor([2, 0], dtype=torch.int32)
    nkeys = (torch.tensor([[70], [101]]) + torch.arange(T)).to(torch.int32)
    mask = (torch.rand(B, T, L, generator=g) > 0.3).to(torch.uint8)
    mask[..., 0] = 1
    nk = native_kernels()
    for m in (None, mask):
        out = nk.attention(q, kc, vc, slots, nkeys, m)
        for b in range(B):
            for t in (0, 1, 15, 16, 17, 31, 32, 39):
                one = nk.attention(q[b:b + 1, :, t:t + 1].contiguous(), kc, vc, slots[b:b + 1],
                                   nkeys[b:b + 1, t:t + 1].contiguous(),
                                   None if m is None else m[b:b + 1, t:t + 1].contiguous())
                assert torch.equal(one[0, :, 0], out[b, :, t]), (b, t, m is None)
        ref = torch.nn.functional.scaled_dot_product_attention(  # and it is attention
            q[:1, :, :1], kc[2:3, :, :70].float().repeat_interleave(heads // kv_heads, 1),
            vc[2:3, :, :70].float().repeat_interleave(heads // kv_heads, 1),
            attn_mask=None if m is None else m[:1, None, :1, :70].bool())
        torch.testing.assert_close(out[:1, :, :1], ref, atol=1e-5, rtol=1e-5)


def test_avx2_body_gives_the_same_bits():
    """Both bodies use the same 256-bit arithmetic: a laptop without AVX512 gets identical output."""
    try:
        avx2 = load_native_kernels(("-mno-avx512f",))
    except (OSError, RuntimeError) as e:
        pytest.skip(f"AVX2 body does not build here: {e}")
    kv = _cache(torch.bfloat16)
    g = torch.Generator().manual_seed(7)
    q = torch.randn(2, H, 3, D, generator=g)
    slots = torch.tensor([0, 3], dtype=torch.int32)
    nkeys = torch.tensor([[38, 39, 40], [20, 21, 22]], dtype=torch.int32)
    mask = (torch.rand(2, 3, 40, generator=g) > 0.3).to(torch.uint8)
    mask[..., 0] = 1
    for scale in (1.0, 40.0):  # 40: weights below exp's underflow bound next to the maximum's
        for m in (None, mask):
            a = native_kernels().attention(q * scale, kv.k[1], kv.v[1], slots, nkeys, m)
            b = avx2.attention(q * scale, kv.k[1], kv.v[1], slots, nkeys, m)
            assert torch.equal(a, b)


@pytest.mark.parametrize("heads,kv_heads,dim", [(12, 2, 128), (10, 2, 72), (14, 2, 40), (8, 2, 64), (4, 4, 64)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_avx2_body_gives_the_same_bits_for_every_pairing(heads, kv_heads, dim, dtype):
    """The AVX512 body runs query heads in pairs, one pair per 512-bit register, up to three pairs at a
    time over the same keys, and an odd head alone; the AVX2 body runs each query's 256-bit chains. Every
    pairing (one, two or three pairs, with and without an odd head), head dims with and without a 64-dim
    remainder, key counts past whole blocks and groups of 4, and masks: the same bits."""
    try:
        avx2 = load_native_kernels(("-mno-avx512f",))
    except (OSError, RuntimeError) as e:
        pytest.skip(f"AVX2 body does not build here: {e}")
    g = torch.Generator().manual_seed(heads * dim)
    B, T, L = 2, 5, 120
    kc = torch.randn(2, kv_heads, L, dim, generator=g).to(dtype)
    vc = torch.randn(2, kv_heads, L, dim, generator=g).to(dtype)
    q = torch.randn(B, heads, T, dim, generator=g) * 3
    slots = torch.tensor([1, 0], dtype=torch.int32)
    nkeys = (torch.tensor([[97], [6]]) + torch.arange(T)).to(torch.int32)
    mask = (torch.rand(B, T, L, generator=g) > 0.3).to(torch.uint8)
    mask[..., 0] = 1
    for m in (None, mask):
        assert torch.equal(native_kernels().attention(q, kc, vc, slots, nkeys, m),
                           avx2.attention(q, kc, vc, slots, nkeys, m))


def test_native_rmsnorm_matches_torch_and_is_row_invariant():
    """The RMSNorm the layers use on CPU: PyTorch's result within float32 rounding, and each row's
    bits independent of the rows beside it."""
    from specdecode.layers.norm import RMSNorm

    norm = RMSNorm(96, 1e-6)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(3, 5, 96, generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        y = norm(x)
        torch.testing.assert_close(y, torch.nn.functional.rms_norm(x, (96,), norm.weight, 1e-6), rtol=1e-5, atol=1e-6)
        assert torch.equal(norm(x[1:2, 3:4]), y[1:2, 3:4])
    x.requires_grad_(True)  # training keeps PyTorch's differentiable path
    norm(x).sum().backward()
    assert x.grad is not None
