"""An EAGLE head's state for one sequence (speculative/eagle.py says how the proposer uses it): its slot in
the head's KV cache, the entries it has fed, and the target features it has not fed yet."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class HeadState:
    slot: int
    base: int = 0  # position of head KV index 0
    fed: int = 0  # committed head entries: positions base .. base + fed - 1
    feats: torch.Tensor | None = None  # [n, F] target features of positions fstart .. fstart + n - 1
    fstart: int = 0
    last: torch.Tensor | None = None  # [H] pre-norm output of entry base + fed - 1 (valid when feats is None)
    buf: torch.Tensor | None = None  # [capacity, F]: feats is its first n rows while commits append to it

    def add_features(self, start: int, feats: torch.Tensor) -> None:
        """Pending features of positions start .. start + n - 1 (contiguous with what is pending). They
        are appended into a buffer of doubling capacity: a head that does not draft for many steps
        gains a few rows per commit, and concatenating would copy everything pending each time."""
        if self.feats is not None and self.fstart + len(self.feats) == start:
            n, m = len(self.feats), len(feats)
            if self.buf is None or self.buf.data_ptr() != self.feats.data_ptr() or n + m > len(self.buf):
                buf = feats.new_empty(max(64, 2 * (n + m)), feats.shape[-1])
                buf[:n] = self.feats
                self.buf = buf
            self.buf[n:n + m] = feats
            self.feats = self.buf[:n + m]
        elif start + len(feats) > self.base + self.fed:
            self.feats, self.fstart = feats, start
