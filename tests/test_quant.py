"""Weight-only quantized linears: the weight round trip stays within the format's bound, forward
matches x @ W_deq.T within the kernel's arithmetic bound, and shard-by-shard loading equals one load."""
import pytest
import torch

from specdecode.kernels import native_kernels
from specdecode.layers.quant import Int4Linear, Int8Linear, dequantize_int4, quantize_int4, quantize_int8
from specdecode.layers.quant.formats import quantize_int4_super

# Both int4 packings run here where the native kernel builds (it needs a C compiler and AVX2).
INT4_KERNELS = ["torch", pytest.param("native", marks=pytest.mark.skipif(
    native_kernels() is None, reason="native int4 kernel not buildable here"))]


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def weight(out_features: int, in_features: int) -> torch.Tensor:
    """Random weight with the awkward rows real checkpoints have: an all-zero row, a constant row,
    and a row far from zero with a small spread (its int4 zero point is rounded coarsely in bf16)."""
    w = torch.randn(out_features, in_features) * 0.05
    w[1] = 0
    w[2] = 0.3
    w[3] = 10 + torch.rand(in_features) * 0.1
    return w


def kernel_tolerance(x: torch.Tensor, w_deq: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Elementwise bound on |forward(x) - (x @ w_deq.T + bias)| for the CPU kernels.

    With S = |x| @ |w_deq|.T: rounding x to bfloat16 costs <= 2^-9 S, the float32 accumulation over K
    inputs <= K 2^-24 S, rounding the kernel's result to bfloat16 <= 2^-9 S (slightly more than S/2^9
    after the two errors above, hence the margin); the float32 scale product and bias add are ulps.
    """
    k = x.shape[-1]
    s = x.double().abs() @ w_deq.double().abs().T
    b = 0 if bias is None else bias.double().abs()
    return (2 ** -8 + (k + 8) * 2 ** -24) * 1.01 * s + 2 ** -22 * b + 1e-30


def native_tolerance(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor,
                     bias: torch.Tensor | None) -> torch.Tensor:
    """Elementwise bound on |forward(x) - (x @ w_deq.T + bias)| for the native int4 kernel.

    The kernel computes sum_k (scale c_k) (sx xq_k) + (zero - 8 scale) sum_k x_k per group, where
    xq rounds x to int8 steps of sx = max|x| / 127: |x - sx xq| <= sx/2, plus the float32 rounding
    of x * (127 / max|x|) (<= 2^-22 |x| after scaling back). So the activation error meets the code
    part |scale c| of the weight, not w itself (an all-zero row has c = 8 and zero = 8 scale). The
    rest is exact integer arithmetic and a few float32 operations per group, each within 2^-24 of
    terms bounded by S = |x| @ (|scale c| + |zero - 8 scale|).T.
    """
    group_size = codes.shape[1] // scale.shape[1]
    code_part = (codes.double().reshape(len(codes), scale.shape[1], -1) * scale.double()[..., None]).reshape(codes.shape)
    min_part = (zero.double() - 8 * scale.double()).abs().repeat_interleave(group_size, dim=1)
    xs = x.double().reshape(-1, x.shape[-1])
    sx = xs.reshape(len(xs), -1, group_size).abs().amax(-1) / 127
    e = sx.repeat_interleave(group_size, dim=1) / 2 + xs.abs() * 2 ** -22
    act = (e @ code_part.abs().T).reshape(x.shape[:-1] + (len(codes),))
    s = x.double().abs() @ (code_part.abs() + min_part).T
    b = 0 if bias is None else bias.double().abs()
    return act * 1.01 + (x.shape[-1] + 64) * 2 ** -22 * s + 2 ** -22 * b + 1e-30


def reference(x, w_deq, bias):
    y = x.double() @ w_deq.double().T
    return y if bias is None else y + bias.double()


def test_int8_round_trip_within_half_a_step():
    w = weight(64, 96)
    q, scale = quantize_int8(w)
    err = (q.float() * scale[:, None] - w).abs()
    # <= scale/2 exactly (q spans [-127, 127], nothing clips); the float32 product adds an ulp of w.
    assert (err <= scale[:, None] / 2 + 2 ** -23 * w.abs()).all()
    assert q.abs().max() == 127


@pytest.mark.parametrize("group_size", [32, 64, 128, 256])
def test_int4_round_trip_within_half_a_step(group_size):
    w = weight(64, 512)
    codes, scale, zero = quantize_int4(w, group_size)
    assert codes.max() <= 15
    # scale and zero are what the kernel stores: bfloat16 values.
    assert torch.equal(scale.to(torch.bfloat16).float(), scale)
    assert torch.equal(zero.to(torch.bfloat16).float(), zero)
    err = (dequantize_int4(codes, scale, zero) - w).abs()
    bound = scale.repeat_interleave(group_size, dim=1) / 2 + 2 ** -21 * w.abs().amax()
    assert (err <= bound).all()
    # The scale is the min/max step (range / 15) widened by at most the bf16 rounding of the zero;
    # on ordinary rows (not row 3) that is under 1%.
    g = w.reshape(64, -1, group_size)
    plain = (g.amax(-1) - g.amin(-1)) / 15
    assert (scale[4:] <= plain[4:] * 1.01 + 1e-30).all()


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("make", [
    lambda w, b: (Int8Linear.from_float(w, b), None, None),
    lambda w, b: (Int4Linear.from_float(w, b, group_size=32, kernel="torch"), 32, torch.bfloat16),
    lambda w, b: (Int4Linear.from_float(w, b, group_size=128, kernel="torch"), 128, torch.bfloat16),
    pytest.param(lambda w, b: (Int4Linear.from_float(w, b, group_size=32, kernel="native"), 32, torch.float16),
                 marks=INT4_KERNELS[1].marks),
    pytest.param(lambda w, b: (Int4Linear.from_float(w, b, group_size=128, kernel="native"), 128, torch.float16),
                 marks=INT4_KERNELS[1].marks),
], ids=["int8", "int4-g32", "int4-g128", "int4-native-g32", "int4-native-g128"])
def test_forward_matches_dequantized_reference(make, bias):
    w = weight(368, 512)  # 368 = 5 full 64-row pack blocks + a 48-row tail
    b = torch.randn(368) if bias else None
    layer, group_size, param_dtype = make(w, b)
    if param_dtype == torch.float16:  # native: sub-scales under super-scales, as (scale, zero) per group
        codes, d, sc, dm, m = quantize_int4_super(w, group_size)
        S = sc.shape[1] // d.shape[1]
        scale = d.repeat_interleave(S, 1) * sc.float()
        params = (codes, scale, dm.repeat_interleave(S, 1) * m.float() + 8 * scale)
    else:
        params = None if group_size is None else quantize_int4(w, group_size, param_dtype)
    w_deq = layer.dequantize() if group_size is None else dequantize_int4(*params)
    for rows in (1, 3, 5, 9, 17):  # 17: two full 8-row passes of the native kernel + a remainder
        x = torch.randn(2, rows, 512)
        y = layer(x)
        assert y.shape == (2, rows, 368) and y.dtype == torch.float32
        err = (y.double() - reference(x, w_deq, b)).abs()
        tol = kernel_tolerance(x, w_deq, b) if param_dtype != torch.float16 else \
            native_tolerance(x, *params, b)
        assert (err <= tol).all(), float(err.max())


@pytest.mark.parametrize("cls,kwargs", [
    (Int8Linear, {}), (Int4Linear, {"group_size": 64, "kernel": "torch"}),
    (Int8Linear, {"kernel": "dequant"}), (Int4Linear, {"group_size": 64, "kernel": "dequant"}),
    pytest.param(Int4Linear, {"group_size": 64, "kernel": "native"}, marks=INT4_KERNELS[1].marks)])
def test_shard_by_shard_loading_equals_one_load(cls, kwargs):
    w = weight(368, 256)
    # Shards as the loader writes q/k/v: arbitrary sizes, out of order, most not 64-row aligned,
    # some in bfloat16 as checkpoints store them.
    shards = [(10, 100, torch.float32), (320, 48, torch.bfloat16), (0, 10, torch.float32),
              (110, 150, torch.bfloat16), (260, 60, torch.float32)]
    # Built the way build_model builds layers: on meta, then to(dtype) and to_empty.
    with torch.device("meta"):
        layer = cls(256, 368, **kwargs)
    layer = layer.to(dtype=torch.float32).to_empty(device="cpu")
    expected_weight = torch.empty_like(w)
    for i, (off, n, dtype) in enumerate(shards):
        rows = w[off:off + n].to(dtype)
        layer.load_rows(off, rows)
        expected_weight[off:off + n] = rows.float()
        if cls is Int4Linear and i == 0:
            # torch packing: rows 10..109 wait for the rest of 64-row blocks 0 and 64; native: rows
            # 10..15 and 96..109 wait for the rest of 16-row tiles 0 and 96.
            assert layer.pending_rows == {"torch": 100, "native": 20, "dequant": 0}[kwargs["kernel"]]
    if cls is Int4Linear:
        assert layer.pending_rows == 0
    whole = cls.from_float(expected_weight, **kwargs)
    buffers = dict(layer.named_buffers())
    for name, buf in whole.named_buffers():
        assert buf.dtype == buffers[name].dtype and torch.equal(buffers[name], buf), name
    x = torch.randn(4, 256)
    assert torch.equal(layer(x), whole(x))


@pytest.mark.parametrize("kernel", INT4_KERNELS)
def test_int4_params_survive_module_dtype_casts(kernel):
    # The kernels need bf16 / fp16 scales and zeros (natively: uint8 sub-scales and fp16 super-scales);
    # they are stored in integer dtypes so that model.to(dtype) (which build_model does) cannot convert them.
    layer = Int4Linear.from_float(weight(64, 128), group_size=32, kernel=kernel)
    x = torch.randn(3, 128)
    y = layer(x)
    for dtype in (torch.float64, torch.float16, torch.float32):
        layer = layer.to(dtype)
        assert layer.qparams.dtype == (torch.uint8 if kernel == "native" else torch.int16)
        assert layer.qsuper is None if kernel != "native" else layer.qsuper.dtype == torch.int16
    assert torch.equal(layer(x), y)


def test_int8_accepts_misaligned_and_bf16_input():
    # The CPU kernel reads activations with aligned 32-byte loads and crashes on a misaligned view.
    w = weight(64, 1536)
    layer = Int8Linear.from_float(w)
    big = torch.randn(2, 1536 + 1)
    x = big[:, 1:]
    expected = layer(x.clone())
    assert torch.equal(layer(x), expected)
    xb = torch.randn(2, 1537).to(torch.bfloat16)[:, 1:]
    assert layer(xb).dtype == torch.bfloat16


def test_invalid_shapes_raise():
    with pytest.raises(ValueError):
        Int8Linear(24, 64)
    with pytest.raises(ValueError):
        Int4Linear(96, 64, group_size=64)
    with pytest.raises(ValueError):
        Int4Linear(128, 40, group_size=32)
    with pytest.raises(ValueError):
        Int8Linear(32, 64).load_rows(60, torch.zeros(8, 32))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("cls,kwargs", [(Int8Linear, {}), (Int4Linear, {"group_size": 32}),
                                        (Int4Linear, {"group_size": 128})])
def test_cuda_layers_multiply_by_their_quantized_weight(cls, kwargs):
    # On CUDA from_float takes PyTorch's kernel where it passed its check, else dequant: either way
    # the product is the quantized weight's, within bfloat16 rounding of activations and results.
    w = weight(256, 512).cuda()
    layer, ref_layer = cls.from_float(w, **kwargs), cls.from_float(w, kernel="dequant", **kwargs)
    assert layer.kernel in ("torch", "dequant")
    x = torch.randn(3, 512, device="cuda")
    ref = x.double() @ ref_layer.dequantize().double().T
    assert (layer(x).double() - ref).abs().max() <= 0.02 * ref.abs().max()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("cls", [Int8Linear, Int4Linear])
def test_cuda_shard_by_shard_loading_equals_one_load(cls):
    # q/k/v shards off the 64-row blocks wait in a stash and are packed when their block completes:
    # on CUDA that must still be the CUDA packing
    from specdecode.layers.quant import device_kernel

    w = weight(368, 256).cuda()
    kwargs = {"group_size": 64} if cls is Int4Linear else {}
    kwargs["kernel"] = device_kernel(cls.kind, "cuda")  # as build_model picks it
    with torch.device("meta"):
        layer = cls(256, 368, **kwargs)
    layer = layer.to(dtype=torch.float32).to_empty(device="cuda")
    for off, n in ((10, 100), (320, 48), (0, 10), (110, 150), (260, 60)):
        layer.load_rows(off, w[off:off + n])
    whole = cls.from_float(w, **kwargs)
    x = torch.randn(4, 256, device="cuda")
    assert torch.equal(layer(x), whole(x))


# -- the dequant kernel (any device) and the per-device choice of PyTorch's kernels -------------------

@pytest.mark.parametrize("group_size", [32, 128])
def test_int4_dequant_kernel_multiplies_by_the_quantized_weight(group_size):
    # The dequant packing is the device-independent reference the CUDA check compares against: its
    # weight must be exactly quantize_int4's (bf16 scale and zero), and forward that weight's product.
    w, b = weight(96, 256), torch.randn(96)
    layer = Int4Linear.from_float(w, b, group_size=group_size, kernel="dequant")
    assert layer.kernel == "dequant"
    w_deq = dequantize_int4(*quantize_int4(w, group_size, torch.bfloat16))
    assert torch.equal(layer.dequantize(), w_deq)
    x = torch.randn(5, 256)
    torch.testing.assert_close(layer(x), x @ w_deq.T + b, rtol=1e-5, atol=1e-5)
    y16 = layer(x.bfloat16())  # a bf16 x dequantizes into bf16 (the GPU case)
    assert y16.dtype == torch.bfloat16
    torch.testing.assert_close(y16.float(), x @ w_deq.T + b, rtol=0.02, atol=0.1)


def test_int8_dequant_kernel_equals_the_torch_kernel_layout():
    w = weight(64, 256)
    a, d = Int8Linear.from_float(w, kernel="torch"), Int8Linear.from_float(w, kernel="dequant")
    assert torch.equal(a.qweight, d.qweight) and torch.equal(a.scales, d.scales)
    x = torch.randn(3, 256)
    torch.testing.assert_close(d(x), x @ d.dequantize().T, rtol=1e-5, atol=1e-5)


def test_device_kernel_takes_pytorchs_kernel_only_where_it_agrees(monkeypatch):
    import specdecode.layers.quant.int4 as quant
    from specdecode.layers.quant import device_kernel
    from specdecode.layers.quant.base import check_device_kernel

    check_device_kernel.cache_clear()
    try:
        assert device_kernel("int4", "cpu") == "torch" and device_kernel("int8", "cpu") == "torch"
        real = quant.int4_mm
        # a packing the kernel reads wrongly (nibbles swapped) -> outputs off by O(1): rejected
        monkeypatch.setattr(quant, "int4_mm", lambda x, w, g, sz: real(x, (w << 4) | (w >> 4), g, sz))
        check_device_kernel.cache_clear()
        with pytest.warns(UserWarning, match="int4 kernel on cpu differs"):
            assert device_kernel("int4", "cpu") == "dequant"

        def missing(*a):
            raise RuntimeError("Could not run '_weight_int4pack_mm' with arguments from the 'CUDA' backend")

        monkeypatch.setattr(quant, "int4_mm", missing)
        check_device_kernel.cache_clear()
        with pytest.warns(UserWarning, match="Could not run"):
            assert device_kernel("int4", "cpu") == "dequant"
    finally:
        check_device_kernel.cache_clear()
