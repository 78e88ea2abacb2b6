"""The native int4 kernel (specdecode/kernels/int4_gemm.c) against an exact reference of its own
arithmetic, for the instruction-set bodies this machine can run (AVX512-VNNI; AVX2 with AVX-VNNI's
256-bit vpdpbusd where the CPU has it, as Intel client cores do; plain AVX2, as Zen 3 runs it)."""
import pytest
import torch

from specdecode.kernels import (TILE, int4_scale_buffers, load_native_kernels, native_kernels, pack_int4, pack_int8,
                                store_int4_scales)
from specdecode.layers.quant.formats import dequantize_int4_super, quantize_int4_super, super_groups

pytestmark = pytest.mark.skipif(native_kernels() is None, reason="native int4 kernel not buildable here")


def _build(flags):
    try:
        return load_native_kernels(flags)
    except (OSError, RuntimeError) as exc:  # e.g. a CPU or compiler without that instruction set
        pytest.skip(f"kernel build {flags}: {exc}")


AVX2 = ("-mno-avx512f",)  # AVX2, with AVX-VNNI where the CPU has it
AVX2_PLAIN = ("-mno-avx512f", "-mno-avxvnni")  # AVX2 alone: Zen 3's body


@pytest.fixture(params=[(), AVX2, AVX2_PLAIN], ids=["native-isa", "avx2", "avx2-plain"])
def kernel(request):
    k = _build(request.param)
    if request.param:
        assert k.isa.startswith("avx2")
    if request.param == AVX2_PLAIN:
        assert k.isa == "avx2"
    return k


def scales(n: int, d, sc, dm, m):
    """quantize_int4_super's (d, sc, dm, m) of an [n, G] weight -> the kernel's (sub, sup) buffers."""
    sub, sup = int4_scale_buffers(n, sc.shape[1], d.shape[1])
    store_int4_scales(sub, sup, 0, d, sc, dm, m)
    return sub, sup


def exact_reference(x, codes, d, sc, dm, m, group_size):
    """The kernel's arithmetic in float64: int8 activations per group, integer dot products, the group
    scale d sc and minimum dm m as float32 products of the stored values."""
    r, k = x.shape
    xg = x.reshape(r, k // group_size, group_size)
    amax = xg.abs().amax(-1)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))  # float32, as in C
    xq = torch.round(xg * inv[..., None]).double()  # round half to even, as lrintf
    dots = torch.einsum("rgk,ngk->rng", xq, codes.reshape(len(codes), k // group_size, group_size).double())
    S = sc.shape[1] // d.shape[1]
    s = (d.half().float().repeat_interleave(S, 1) * sc.float()).double()
    z = (dm.half().float().repeat_interleave(S, 1) * m.float()).double()
    return (dots * (amax.double() / 127)[:, None, :] * s[None] + z[None] * xg.double().sum(-1)[:, None, :]).sum(-1)


@pytest.mark.parametrize("group_size,k", [(32, 512), (64, 512), (128, 512), (32, 224)])
def test_kernel_equals_its_exact_arithmetic(kernel, group_size, k):
    # k = 224: 7 groups of 32 in one super-block of 7 (super_groups), as hidden 896 of the 0.5B
    torch.manual_seed(0)
    n = 96
    w = torch.randn(n, k) * 0.05
    w[5] = 0  # all-zero row: smallest half scale, codes 0
    w[6] += 3  # large minimum
    w[7] -= 3  # negative minimum
    codes, d, sc, dm, m = quantize_int4_super(w, group_size)
    packed = pack_int4(codes, group_size)
    sub, sup = scales(n, d, sc, dm, m)
    for rows in (1, 2, 7, 8, 9, 16, 19, 35):  # every remainder path of the 8-row passes; AMX's 16-row ones
        x = torch.randn(rows, k)
        x[0, :group_size] = 0  # an all-zero activation group (scale 0)
        y = kernel.int4_gemm(x, packed, sub, sup, n, group_size)
        ref = exact_reference(x, codes, d, sc, dm, m, group_size)
        # Left: float32 rounding of a few products and sums per group (|terms| <= ~3 |ref| scale).
        w_abs = dequantize_int4_super(codes, d, sc, dm, m).abs().double() + \
            (dm.repeat_interleave(sc.shape[1] // d.shape[1], 1) * m.float()).abs().double().repeat_interleave(group_size, 1)
        scale_of = x.double().abs() @ w_abs.T
        assert ((y.double() - ref).abs() <= 2 ** -18 * scale_of + 1e-12).all()


@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_super_quantization_covers_each_group_within_half_a_step(group_size):
    """Every weight is within half its group's step d sc of its level, and the step exceeds the
    group's own (hi - lo) / 15 by at most the rounding of the minimum and of d."""
    torch.manual_seed(3)
    w = torch.randn(32, 1024) * 0.05
    w[1] += 1  # a row far from zero
    w[2, :256] = 0  # an all-zero super-block
    codes, d, sc, dm, m = quantize_int4_super(w, group_size)
    S = super_groups(1024 // group_size)
    assert d.shape == (32, 1024 // group_size // S) and sc.dtype == torch.uint8 and m.dtype == torch.int8
    step = (d.repeat_interleave(S, 1) * sc.float()).repeat_interleave(group_size, 1)
    err = (dequantize_int4_super(codes, d, sc, dm, m) - w).abs()
    assert (err <= step / 2 * (1 + 1e-5) + 1e-12).all()
    g = w.reshape(32, -1, group_size)
    span = (g.amax(-1) - g.amin(-1)) / 15
    bound = span + dm.repeat_interleave(S, 1) / 15 + d.repeat_interleave(S, 1)
    assert (d.repeat_interleave(S, 1) * sc.float() <= bound * (1 + 1e-5)).all()
    assert torch.equal(dequantize_int4_super(codes, d, sc, dm, m)[2, :256], torch.zeros(256))


@pytest.mark.parametrize("group_size,k", [(32, 512), (64, 512), (32, 224)])
def test_avx_vnni_body_gives_the_bits_of_the_plain_avx2_body(group_size, k):
    # The same integer dots (vpdpbusd against maddubs + int16 sums + madd) and the same float epilogue:
    # an Intel client core and Zen 3 give the same outputs, row for row.
    vnni, plain = _build(AVX2), _build(AVX2_PLAIN)
    if vnni.isa == plain.isa:
        pytest.skip("this CPU has no AVX-VNNI")
    torch.manual_seed(3)
    n = 64
    codes, d, sc, dm, m = quantize_int4_super(torch.randn(n, k) * 0.05, group_size)
    packed, (sub, sup) = pack_int4(codes, group_size), scales(n, d, sc, dm, m)
    for rows in range(1, 11):
        x = torch.randn(rows, k)
        assert torch.equal(vnni.int4_gemm(x, packed, sub, sup, n, group_size),
                           plain.int4_gemm(x, packed, sub, sup, n, group_size)), rows


@pytest.mark.parametrize("group_size", [32, 64])
def test_extreme_codes_and_activations_do_not_overflow(kernel, group_size):
    # Every code 15 against activations all at +-127 after quantization: the largest partial sums the
    # kernels form in narrow integers (the AVX2 body sums up to 8 maddubs results, each two products,
    # in int16: 8 * 2 * 15 * 127 = 30480, just below 32767). Rows 1 to 10 cover every row block of
    # both bodies.
    n, k = 32, 256
    G = k // group_size
    codes = torch.full((n, k), 15, dtype=torch.uint8)
    ones = torch.ones(n, G // super_groups(G))
    sub, sup = scales(n, ones, torch.full((n, G), 255, dtype=torch.uint8), ones,
                      torch.full((n, G), -127, dtype=torch.int8))
    packed = pack_int4(codes, group_size)
    for rows in range(1, 11):
        x = torch.ones(rows, k)
        x[1::2] = -1  # odd rows at -127
        y = kernel.int4_gemm(x, packed, sub, sup, n, group_size)
        w = 15 * 255 - 127  # every weight: code * d * sc + dm * m
        expected = torch.where(x[:, :1] > 0, float(w * k), float(-w * k)).expand(rows, n)
        assert torch.equal(y, expected), rows

def test_int8_kernel_equals_its_exact_arithmetic(kernel):
    """y = wscale * sum_g sx_g * (q . xq)_g with the int8 activations of the int4 kernel (groups of 32)."""
    torch.manual_seed(2)
    n, k = 64, 256
    q = torch.randint(-127, 128, (n, k), dtype=torch.int8)
    wscale = torch.rand(n) * 0.01 + 1e-3
    packed = pack_int8(q)
    for rows in (1, 3, 8, 9):
        x = torch.randn(rows, k)
        x[0, :32] = 0
        y = kernel.int8_gemm(x, packed, wscale, n)
        xg = x.reshape(rows, k // 32, 32)
        amax = xg.abs().amax(-1)
        inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
        xq = torch.round(xg * inv[..., None]).double()
        dots = torch.einsum("rgk,ngk->rng", xq, q.double().reshape(n, k // 32, 32))
        ref = (dots * (amax.double() / 127)[:, None, :]).sum(-1) * wscale.double()
        scale_of = x.double().abs() @ (q.double().abs() * wscale.double()[:, None]).T
        assert ((y.double() - ref).abs() <= 2 ** -18 * scale_of + 1e-12).all()


@pytest.mark.parametrize("k", [32, 64, 96, 128, 160, 224, 512, 8192])
def test_every_row_gets_the_bits_of_a_one_row_pass(kernel, k):
    # Verification is lossless only if a row's output does not depend on how many rows share its
    # pass (a verify of t tokens must give what t one-token steps give). Row counts cover every pass
    # of the bodies: blocks of 8 or 10 rows, their remainders, AMX's passes of 12-15 rows and its
    # blocks of 16 with a VNNI remainder; k from 1 to 16 groups covers the AMX pipeline's ends, and
    # k = 8192 splits 33 or more rows into the row blocks of a prompt chunk (30 or 32 rows per block).
    torch.manual_seed(4)
    n = 48
    codes, d, sc, dm, m = quantize_int4_super(torch.randn(n, k) * 0.05, 32)
    packed, (sub, sup) = pack_int4(codes, 32), scales(n, d, sc, dm, m)
    x = torch.randn(50, k)
    one = torch.cat([kernel.int4_gemm(x[i:i + 1], packed, sub, sup, n, 32) for i in range(len(x))])
    for rows in (9, 10, 11, 12, 13, 15, 16, 17, 31, 32, 33, 50):
        assert torch.equal(kernel.int4_gemm(x[:rows], packed, sub, sup, n, 32), one[:rows]), rows


@pytest.mark.parametrize("k,rows", [(1536, 1), (1536, 9), (1536, 40), (8192, 50)])
def test_threads_sharing_tiles_give_every_output_its_bits(kernel, k, rows):
    # The GEMMs' threads take their tiles from shared ranges and steal from each other's (share.h):
    # more threads than CPUs make them steal. Every output must be written once, with the bits one
    # thread gives it. A result computed for other inputs just before leaves its values in the
    # memory the next result reuses, so a tile nobody wrote would show. k = 8192 with 50 rows: row
    # blocks, each with its own ranges; 37 tiles of 1536 inputs: chunks of 5 and a remainder.
    torch.manual_seed(6)
    n = 16 * 37
    codes, d, sc, dm, m = quantize_int4_super(torch.randn(n, k) * 0.05, 32)
    packed, (sub, sup) = pack_int4(codes, 32), scales(n, d, sc, dm, m)
    q8 = torch.randint(-127, 128, (n, k), dtype=torch.int8)
    packed8, wscale = pack_int8(q8), torch.rand(n) * 0.01 + 1e-3
    x, other = torch.randn(rows, k), torch.randn(rows, k)
    saved = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        want4, want8 = kernel.int4_gemm(x, packed, sub, sup, n, 32), kernel.int8_gemm(x, packed8, wscale, n)
        for threads in (2, 3, 5, 8):
            torch.set_num_threads(threads)
            for _ in range(3):
                kernel.int4_gemm(other, packed, sub, sup, n, 32)
                assert torch.equal(kernel.int4_gemm(x, packed, sub, sup, n, 32), want4), threads
                kernel.int8_gemm(other, packed8, wscale, n)
                assert torch.equal(kernel.int8_gemm(x, packed8, wscale, n), want8), threads
    finally:
        torch.set_num_threads(saved)


def test_amx_body_gives_the_bits_of_the_vnni_body():
    amx, vnni = native_kernels(), _build(("-DSPECDECODE_NO_AMX",))
    if not amx.isa.endswith("+amx"):
        pytest.skip("this CPU (or compiler, or kernel) offers no AMX")
    assert vnni.isa == "avx512vnni"
    torch.manual_seed(5)
    n, k = 64, 1536
    codes, d, sc, dm, m = quantize_int4_super(torch.randn(n, k) * 0.05, 32)
    packed, (sub, sup) = pack_int4(codes, 32), scales(n, d, sc, dm, m)
    for rows in (12, 15, 16, 21, 48, 80):
        x = torch.randn(rows, k)
        assert torch.equal(amx.int4_gemm(x, packed, sub, sup, n, 32), vnni.int4_gemm(x, packed, sub, sup, n, 32)), rows


def test_packed_tiles_are_independent_row_ranges():
    # Rows 16 t .. 16 t + 15 of the packed weight depend only on rows 16 t .. of the codes: the
    # loader packs q/k/v and gate/up shards separately on tile boundaries.
    torch.manual_seed(1)
    codes = torch.randint(0, 16, (64, 256), dtype=torch.uint8)
    whole = pack_int4(codes, 32)
    assert torch.equal(torch.cat([pack_int4(codes[:16], 32), pack_int4(codes[16:], 32)]), whole)
    # Nibble placement of one element (tile 1, lane 3, group 2, chunk 1, high half, byte 2).
    n, kk = 16 + 3, 2 * 32 + 8 * 1 + 4 + 2
    flat = whole[16:32].reshape(-1)
    byte = flat[(2 * 4 + 1) * 64 + 4 * 3 + 2]
    assert int(byte) >> 4 == int(codes[n, kk])
