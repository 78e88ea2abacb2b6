"""Weight-only quantized linears: the weight round trip stays within the format's bound, forward
matches x @ W_deq.T within the kernel's arithmetic bound, and shard-by-shard loading equals one load."""
import pytest
import torch

from specdecode.layers.quant import Int4Linear, Int8Linear, dequantize_int4, quantize_int4, quantize_int8


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
    lambda w, b: (Int8Linear.from_float(w, b), None),
    lambda w, b: (Int4Linear.from_float(w, b, group_size=32), 32),
    lambda w, b: (Int4Linear.from_float(w, b, group_size=128), 128),
], ids=["int8", "int4-g32", "int4-g128"])
def test_forward_matches_dequantized_reference(make, bias):
    w = weight(368, 512)  # 368 = 5 full 64-row pack blocks + a 48-row tail
    b = torch.randn(368) if bias else None
    layer, group_size = make(w, b)
    w_deq = layer.dequantize() if group_size is None else dequantize_int4(*quantize_int4(w, group_size))
    for rows in (1, 3, 5, 9):
        x = torch.randn(2, rows, 512)
        y = layer(x)
        assert y.shape == (2, rows, 368) and y.dtype == torch.float32
        err = (y.double() - reference(x, w_deq, b)).abs()
        assert (err <= kernel_tolerance(x, w_deq, b)).all(), float(err.max())


@pytest.mark.parametrize("cls,kwargs", [(Int8Linear, {}), (Int4Linear, {"group_size": 64})])
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
            assert layer.pending_rows == 100  # rows 10..109 wait for the rest of blocks 0 and 64
    if cls is Int4Linear:
        assert layer.pending_rows == 0
    whole = cls.from_float(expected_weight, **kwargs)
    buffers = dict(layer.named_buffers())
    for name, buf in whole.named_buffers():
        assert buf.dtype == buffers[name].dtype and torch.equal(buffers[name], buf), name
    x = torch.randn(4, 256)
    assert torch.equal(layer(x), whole(x))


def test_int4_params_survive_module_dtype_casts():
    # The kernel needs bf16 scales/zeros; they are stored as int16 bits so that model.to(dtype) (which
    # build_model does) cannot convert them.
    layer = Int4Linear.from_float(weight(64, 128), group_size=32)
    x = torch.randn(3, 128)
    y = layer(x)
    for dtype in (torch.float64, torch.float16, torch.float32):
        layer = layer.to(dtype)
        assert layer.qparams.dtype == torch.int16
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
def test_cuda_int8_and_int4_refusal():
    w = weight(256, 512)
    layer = Int8Linear.from_float(w.cuda())
    x = torch.randn(3, 512, device="cuda")
    w_deq = layer.dequantize()
    # On CUDA the kernel computes in float32 throughout: only the accumulation order differs.
    err = (layer(x).double() - reference(x, w_deq, None)).abs()
    assert (err <= 520 * 2 ** -24 * 1.01 * (x.double().abs() @ w_deq.double().abs().T)).all()
    with pytest.raises(NotImplementedError):
        Int4Linear.from_float(w.cuda(), group_size=128)
