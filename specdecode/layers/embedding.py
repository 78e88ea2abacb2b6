"""Int8 embedding table for quantized models: one row is read per token, so the table costs memory,
not bandwidth; int8 with a scale per row keeps it at a quarter of float32 (Qwen2.5-1.5B: 233 MB).

A tied model (embedding = LM head) whose head is an ``Int8Linear`` stores the table once: the two use
the same per-row symmetric int8 format, so ``share_with`` points the embedding at the head's buffers
(bit-identical rows).

``FileEmbedding`` goes further for GGUF files: the table stays in the memory-mapped file in its own
quantized format and only the rows looked up are dequantized, so it costs the pages of the tokens
actually seen, not a resident copy (Qwen2.5-1.5B: 233 MB of int8 avoided)."""
from __future__ import annotations

from collections import OrderedDict
from typing import Callable

import numpy as np
import torch
from torch import nn

from .quant.formats import Int4Rows, quantize_int8


class Int8Embedding(nn.Module):
    def __init__(self, num_embeddings: int, dim: int, out_dtype: torch.dtype = torch.float32):
        super().__init__()
        self.num_embeddings, self.dim, self.out_dtype = num_embeddings, dim, out_dtype
        self.register_buffer("qweight", torch.empty(num_embeddings, dim, dtype=torch.int8))
        self.register_buffer("scales", torch.empty(num_embeddings, dtype=torch.float32))
        self.shared = False  # True: qweight/scales are the LM head's; the loader fills them there
        self._rows = lambda ids: self.qweight[ids]  # int64 ids [n] -> int8 [n, dim]

    def share_with(self, head: nn.Module) -> None:
        """Reads rows from an Int8Linear LM head of the same shape (its int8_rows(ids) and scales [V]);
        the head may keep them in a kernel's packed layout."""
        if tuple(head.qweight.shape) != (self.num_embeddings, self.dim):
            raise ValueError(f"LM head {tuple(head.qweight.shape)} is not a [{self.num_embeddings}, {self.dim}] table")
        self.qweight, self.scales, self.shared = head.qweight, head.scales, True
        self._rows = head.int8_rows

    @torch.no_grad()
    def load_rows(self, offset: int, rows: torch.Tensor | Int4Rows) -> None:
        """rows [n, dim] float -> int8 rows [offset, offset + n), symmetric per row (error <= scale/2)."""
        q, scale = quantize_int8(rows.dense() if isinstance(rows, Int4Rows) else rows.float())
        self.qweight[offset:offset + len(rows)] = q
        self.scales[offset:offset + len(rows)] = scale

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [...] -> [..., dim] in out_dtype."""
        flat = ids.reshape(-1)
        rows = self._rows(flat).to(torch.float32) * self.scales[flat].unsqueeze(-1)
        return rows.reshape(ids.shape + (self.dim,)).to(self.out_dtype)


class FileEmbedding(nn.Module):
    """Rows dequantized on lookup from a table kept outside the process's own memory (a file mapping).

    ``read_rows(ids) -> float32 [len(ids), dim]`` for unique int64 ids (numpy); it is called once per
    forward with the distinct ids of the batch that are not cached. No parameters or buffers: loaders
    skip this table.

    The most recently used rows (up to ``cache_bytes``) are kept dequantized: decoding looks up one
    or a few tokens a step, mostly frequent ones, and dequantizing a row from the file costs ~0.4 ms
    a step in Python (2 % of a 1.5B step)."""

    def __init__(self, num_embeddings: int, dim: int, read_rows: Callable[[np.ndarray], torch.Tensor],
                 out_dtype: torch.dtype = torch.float32, cache_bytes: int = 16 << 20):
        super().__init__()
        self.num_embeddings, self.dim, self.out_dtype = num_embeddings, dim, out_dtype
        self._read_rows = read_rows
        self._cache: OrderedDict[int, torch.Tensor] = OrderedDict()  # id -> float32 [dim], LRU order
        self._cache_rows = max(0, cache_bytes // (4 * dim))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [...] -> [..., dim] in out_dtype, on ids' device."""
        uniq, inverse = torch.unique(ids.cpu(), return_inverse=True)
        keys = uniq.tolist()
        cache = self._cache
        missing = [i for i in keys if i not in cache]
        fresh = dict(zip(missing, self._read_rows(np.asarray(missing, dtype=np.int64)))) if missing else {}
        rows = torch.stack([fresh[i] if i in fresh else cache[i] for i in keys])
        for i in keys:  # most recently used last
            if i in fresh:
                cache[i] = fresh[i].clone()
            else:
                cache.move_to_end(i)
        self._evict()
        return rows[inverse].to(ids.device, self.out_dtype)

    def row(self, token: int) -> torch.Tensor:
        """float32 [dim]: token's row as forward looks it up, without a batch's unique / stack / index
        (a decode step's one lookup). The caller must not write to it (it may be the cached row)."""
        cache = self._cache
        r = cache.get(token)
        if r is None:
            r = self._read_rows(np.asarray([token], dtype=np.int64))[0]
            cache[token] = r.clone()
            self._evict()
        else:
            cache.move_to_end(token)
        return r

    def _evict(self) -> None:
        while len(self._cache) > self._cache_rows:
            self._cache.popitem(last=False)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.dim}, rows read from the model file"
