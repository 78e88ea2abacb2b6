"""SwiGLU feed-forward: down(silu(gate(x)) * up(x)), gate and up packed in one matmul."""
import torch
import torch.nn.functional as F
from torch import nn

from ..kernels import native_kernels
from .linear import make_linear


class SwiGLU(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.intermediate = intermediate
        self.gate_up_proj = make_linear(hidden, 2 * intermediate, bias=False)  # rows: [gate; up]
        self.down_proj = make_linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gu = self.gate_up_proj(x)
        nk = native_kernels()
        # Inference on CPU in float32: the native silu x up, which the fused decoder layer
        # (kernels/layer.c) also uses, so that the fused and unfused paths give the same bits.
        if (nk is not None and gu.dtype == torch.float32 and gu.device.type == "cpu" and self.intermediate % 8 == 0
                and not (torch.is_grad_enabled() and gu.requires_grad)):
            return self.down_proj(nk.silu_mul(gu.contiguous()))
        gate, up = gu.split(self.intermediate, dim=-1)
        return self.down_proj(F.silu(gate) * up)
