"""Int8 embedding table for quantized models: one row is read per token, so the table costs memory,
not bandwidth; int8 with a scale per row keeps it at a quarter of float32 (Qwen2.5-1.5B: 233 MB)."""
from __future__ import annotations

import torch
from torch import nn


class Int8Embedding(nn.Module):
    def __init__(self, num_embeddings: int, dim: int, out_dtype: torch.dtype = torch.float32):
        super().__init__()
        self.num_embeddings, self.dim, self.out_dtype = num_embeddings, dim, out_dtype
        self.register_buffer("qweight", torch.empty(num_embeddings, dim, dtype=torch.int8))
        self.register_buffer("scales", torch.empty(num_embeddings, dtype=torch.float32))

    @torch.no_grad()
    def load_rows(self, offset: int, rows: torch.Tensor) -> None:
        """rows [n, dim] float -> int8 rows [offset, offset + n), symmetric per row (error <= scale/2)."""
        rows = rows.float()
        scale = (rows.abs().amax(dim=1) / 127).clamp(min=torch.finfo(torch.float32).tiny)
        self.qweight[offset:offset + len(rows)] = torch.round(rows / scale[:, None]).clamp_(-127, 127).to(torch.int8)
        self.scales[offset:offset + len(rows)] = scale

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [...] -> [..., dim] in out_dtype."""
        return (self.qweight[ids].to(torch.float32) * self.scales[ids].unsqueeze(-1)).to(self.out_dtype)
