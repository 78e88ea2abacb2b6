"""The operands of layer.c's fused decoder layer as ctypes structures (field for field layer.c's
sd_linear, sd_layer and sd_batch), and their construction from tensors.

A structure holds raw pointers: the tensors it was built from must stay alive and in place while it
is used: ``LayerOperands`` keeps references to them for that reason."""
from __future__ import annotations

import ctypes

import torch

_p, _i, _f = ctypes.c_void_p, ctypes.c_int32, ctypes.c_float


class SdLinear(ctypes.Structure):
    _fields_ = [("kind", _i), ("K", _i), ("N", _i), ("gs", _i), ("w", _p), ("s", _p), ("z", _p), ("bias", _p)]


class SdLayer(ctypes.Structure):
    _fields_ = [("hidden", _i), ("H", _i), ("Hkv", _i), ("D", _i), ("inter", _i), ("eps", _f),
                ("in_norm", _p), ("post_norm", _p), ("q_norm", _p), ("k_norm", _p),
                ("qkv", SdLinear), ("o", SdLinear), ("gate_up", SdLinear), ("down", SdLinear),
                ("embed_norm", _p), ("norm_residual", _i)]


class SdBatch(ctypes.Structure):
    _fields_ = [("B", _i), ("T", _i), ("N", _i), ("pos", _p), ("slots", _p), ("starts", _p), ("num_new", _p),
                ("nkeys", _p), ("mask", _p), ("Lm", _i), ("cos", _p), ("sin", _p), ("bf16", _i), ("Lmax", _i), ("scale", _f)]


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def linear_operands(kind: int, in_features: int, out_features: int, group_size: int, qweight: torch.Tensor,
                    scales: torch.Tensor, zeros: torch.Tensor | None, bias: torch.Tensor | None) -> SdLinear:
    """kind 4: qweight / scales / zeros as Int4Linear's native packing (scales, zeros: its uint8
    sub-scales qparams and int16 super-scales qsuper); kind 8: qweight and float32 scales [N] as Int8Linear's."""
    for t in (qweight, scales, zeros, bias):
        assert t is None or (t.is_contiguous() and t.device.type == "cpu")
    return SdLinear(kind, in_features, out_features, group_size, _ptr(qweight), _ptr(scales), _ptr(zeros),
                    _ptr(bias))


class LayerOperands:
    """One decoder layer's sd_layer, with the tensors its pointers point into. ``embed_norm`` and
    ``norm_residual``: an EAGLE-3 head's layer (layer.c's specdecode_eagle3_layer)."""

    def __init__(self, dims: tuple[int, int, int, int, int], eps: float, norms: list[torch.Tensor | None],
                 linears: list[SdLinear], keep: list[torch.Tensor], embed_norm: torch.Tensor | None = None,
                 norm_residual: bool = False):
        hidden, H, Hkv, D, inter = dims
        self.keep = keep + [n for n in norms + [embed_norm] if n is not None]
        self.struct = SdLayer(hidden, H, Hkv, D, inter, eps, *map(_ptr, norms), *linears, _ptr(embed_norm),
                              int(norm_residual))
