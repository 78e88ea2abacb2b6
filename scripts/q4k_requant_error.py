"""Relative RMS error of our int4 requantization (layers/quant/formats.py) against a GGUF file's own
dequantized values, for a few tensors of the 1.5B: python scripts/q4k_requant_error.py"""
import numpy as np, torch, gguf
from gguf import GGUFReader
from specdecode.layers.quant.formats import quantize_int4, dequantize_int4
r = GGUFReader('/root/.cache/specdecode/models/qwen2.5-coder-1.5b-instruct.gguf')
ts = {t.name: t for t in r.tensors}
for name in ["blk.3.ffn_gate.weight", "blk.10.attn_q.weight", "blk.20.ffn_up.weight", "blk.5.ffn_down.weight"]:
    t = ts[name]
    w = gguf.quants.dequantize(t.data, t.tensor_type).reshape(-1, t.shape[0]).astype(np.float32)
    W = torch.from_numpy(w)
    c, s, z = quantize_int4(W, 32, torch.float16)
    d = dequantize_int4(c, s, z)
    err = (d - W)
    g = W.reshape(W.shape[0], -1, 32)
    spanfull = ((c.reshape(g.shape).amax(-1) == 15) & (c.reshape(g.shape).amin(-1) == 0)).float().mean()
    print(name, t.tensor_type.name, "rel rms err of our requant vs file values: %.4f" % (err.pow(2).mean().sqrt() / W.pow(2).mean().sqrt()).item(),
          "exact frac %.3f" % (err.abs() < 1e-6 * W.abs().max()).float().mean().item(), "groups spanning 0..15: %.3f" % spanfull.item())
