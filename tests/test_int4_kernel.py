"""The native int4 kernel (specdecode/kernels/int4_gemm.c) against an exact reference of its own
arithmetic, for both instruction-set bodies this machine can run (AVX512-VNNI and AVX2)."""
import pytest
import torch

from specdecode.kernels import TILE, load_native_kernels, native_kernels, pack_int4, pack_int8
from specdecode.layers.quant import quantize_int4

pytestmark = pytest.mark.skipif(native_kernels() is None, reason="native int4 kernel not buildable here")


def _build(flags):
    try:
        return load_native_kernels(flags)
    except (OSError, RuntimeError) as exc:  # e.g. a CPU or compiler without that instruction set
        pytest.skip(f"kernel build {flags}: {exc}")


@pytest.fixture(params=[(), ("-mno-avx512f",)], ids=["native-isa", "avx2"])
def kernel(request):
    k = _build(request.param)
    if request.param:
        assert k.isa == "avx2"
    return k


def tiles(values: torch.Tensor) -> torch.Tensor:
    """float [N, G] -> half bits int16 [N / 16, G, 16] (the kernel's scale/zero layout)."""
    n, g = values.shape
    return values.half().reshape(n // TILE, TILE, g).transpose(1, 2).contiguous().view(torch.int16)


def exact_reference(x, codes, scale, zero, group_size):
    """The kernel's arithmetic in float64: int8 activations per group, integer dot products."""
    r, k = x.shape
    xg = x.reshape(r, k // group_size, group_size)
    amax = xg.abs().amax(-1)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))  # float32, as in C
    xq = torch.round(xg * inv[..., None]).double()  # round half to even, as lrintf
    dots = torch.einsum("rgk,ngk->rng", xq, codes.reshape(len(codes), k // group_size, group_size).double())
    s, z = scale.double(), zero.double()
    return (dots * (amax.double() / 127)[:, None, :] * s[None] + (z - 8 * s)[None] * xg.double().sum(-1)[:, None, :]).sum(-1)


@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_kernel_equals_its_exact_arithmetic(kernel, group_size):
    torch.manual_seed(0)
    n, k = 96, 512
    w = torch.randn(n, k) * 0.05
    w[5] = 0  # all-zero row: smallest half scale, codes 8
    w[6] += 3  # large zero point
    codes, scale, zero = quantize_int4(w, group_size, torch.float16)
    packed = pack_int4(codes, group_size)
    for rows in (1, 2, 7, 8, 9, 19):  # every remainder path of the 8-row passes
        x = torch.randn(rows, k)
        x[0, :group_size] = 0  # an all-zero activation group (scale 0)
        y = kernel.int4_gemm(x, packed, torch.stack([tiles(scale), tiles(zero)]), n, group_size)
        ref = exact_reference(x, codes, scale, zero, group_size)
        # Left: float32 rounding of a few products and sums per group (|terms| <= ~3 |ref| scale).
        scale_of = (x.double().abs() @ (codes.double() * scale.double().repeat_interleave(group_size, 1)
                                         + (zero - 8 * scale).double().abs().repeat_interleave(group_size, 1)).T)
        assert ((y.double() - ref).abs() <= 2 ** -18 * scale_of + 1e-12).all()


@pytest.mark.parametrize("group_size", [32, 64])
def test_extreme_codes_and_activations_do_not_overflow(kernel, group_size):
    # Every code 15 against activations all at +-127 after quantization: the largest partial sums the
    # kernels form in narrow integers (the AVX2 body sums up to 8 maddubs results, each two products,
    # in int16: 8 * 2 * 15 * 127 = 30480, just below 32767). Rows 1 to 10 cover every row block of
    # both bodies.
    n, k = 32, 256
    codes = torch.full((n, k), 15, dtype=torch.uint8)
    scale, zero = torch.ones(n, k // group_size), torch.zeros(n, k // group_size)
    packed, qp = pack_int4(codes, group_size), torch.stack([tiles(scale), tiles(zero)])
    for rows in range(1, 11):
        x = torch.ones(rows, k)
        x[1::2] = -1  # odd rows at -127
        y = kernel.int4_gemm(x, packed, qp, n, group_size)
        expected = torch.where(x[:, :1] > 0, 7.0 * k, -7.0 * k).expand(rows, n)  # (15 - 8) * sum(x)
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
