"""SwiGLU feed-forward: down(silu(gate(x)) * up(x)), gate and up packed in one matmul."""
import torch
import torch.nn.functional as F
from torch import nn

from .linear import make_linear


class SwiGLU(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.intermediate = intermediate
        self.gate_up_proj = make_linear(hidden, 2 * intermediate, bias=False)  # rows: [gate; up]
        self.down_proj = make_linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate, dim=-1)
        return self.down_proj(F.silu(gate) * up)
