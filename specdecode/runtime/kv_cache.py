"""Preallocated KV cache with per-sequence slots and lengths.

Layout: k, v [num_layers, num_slots, num_kv_heads, max_len, head_dim]. A slot holds one sequence;
``lengths[slot]`` tokens of it are committed. Rolling back rejected draft tokens is
``set_length(slot, n)``: O(1), the stale entries are simply overwritten by the next forward
(gpt-fast's "rollback is don't advance").

Memory is touched lazily: the tensors are allocated uninitialised (the OS maps pages on first
write), and a slot's entries are zeroed up to the furthest index a forward reads (CLEAN_AHEAD more),
the first time it reads that far. Keys a query may not see still enter the attention kernel
(masked), so they must be finite; zeros are. An idle slot therefore costs address space, not
resident memory."""
from __future__ import annotations

from contextlib import contextmanager

import torch

from ..errors import OutOfMemoryBudgetError

CLEAN_AHEAD = 64  # entries a slot's zeroing runs past what a forward reads (a few KiB per layer)

class KVCache:
    def __init__(self, num_layers: int, num_slots: int, max_len: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype, device: torch.device | str = "cpu"):
        shape = (num_layers, num_slots, num_kv_heads, max_len, head_dim)
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)
        self.max_len = max_len
        self.lengths = [0] * num_slots
        self._clean = [0] * num_slots  # entries [0, _clean[slot]) of every layer are finite (zeroed or written)
        self._free = list(range(num_slots - 1, -1, -1))

    @staticmethod
    def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return 2 * num_layers * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()

    @classmethod
    def from_budget(cls, budget_bytes: int, num_slots: int, max_len: int, num_layers: int,
                    num_kv_heads: int, head_dim: int, dtype: torch.dtype, device="cpu") -> "KVCache":
        """Largest per-slot length (≤ max_len) whose cache fits ``budget_bytes``."""
        per_tok = cls.bytes_per_token(num_layers, num_kv_heads, head_dim, dtype)
        fit = budget_bytes // (per_tok * num_slots)
        if fit < 16:
            raise OutOfMemoryBudgetError(
                f"KV cache budget of {budget_bytes / 2**20:.0f} MiB cannot hold {num_slots} sequence(s) "
                f"of even 16 tokens ({per_tok} bytes per token); raise the budget or lower the slot count")
        return cls(num_layers, num_slots, min(max_len, fit), num_kv_heads, head_dim, dtype, device)

    @property
    def num_slots(self) -> int:
        return len(self.lengths)

    def allocate(self, slot: int | None = None) -> int:
        """Takes a free slot (``slot``, or the most recently freed one) with length 0."""
        if not self._free:
            raise OutOfMemoryBudgetError("no free KV-cache slot")
        if slot is None:
            slot = self._free.pop()
        else:
            self._free.remove(slot)
        self.lengths[slot] = 0
        return slot

    def free(self, slot: int) -> None:
        self.lengths[slot] = 0
        self._free.append(slot)

    @property
    def free_slots(self) -> int:
        return len(self._free)

    def free_slot_ids(self) -> list[int]:
        return list(self._free)

    @contextmanager
    def scratch_slot(self):
        """A free slot for a measurement, freed afterwards (its entries are garbage to everyone else)."""
        slot = self.allocate()
        try:
            yield slot
        finally:
            self.free(slot)

    def check_fits(self, slot: int, extra: int) -> None:
        if self.lengths[slot] + extra > self.max_len:
            raise OutOfMemoryBudgetError(
                f"sequence needs {self.lengths[slot] + extra} tokens but the KV cache holds {self.max_len} per sequence")

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor, slots: list[int], starts: list[int],
               num_new: list[int], total_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Writes new k, v [B, Hkv, T, D] at each row's start and returns the keys/values to attend,
        [B, Hkv, total_len, D] (a view when B == 1). Does not change ``lengths``: the engine
        commits by calling ``set_length`` after acceptance."""
        self.write(layer, k, v, slots, starts, num_new, total_len)
        ck, cv = self.k[layer], self.v[layer]
        if len(slots) == 1:
            s0 = slots[0]
            return ck[s0:s0 + 1, :, :total_len], cv[s0:s0 + 1, :, :total_len]
        idx = torch.tensor(slots, device=ck.device)
        return ck[idx, :, :total_len], cv[idx, :, :total_len]

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, slots: list[int], starts: list[int],
              num_new: list[int], total_len: int) -> None:
        """update's write half, for backends that read the cache in place: zeroes what a later
        reader of [0, total_len) could see unwritten, then stores the new rows."""
        self.clean(slots, total_len)
        ck, cv = self.k[layer], self.v[layer]
        for b, (slot, s, n) in enumerate(zip(slots, starts, num_new)):
            ck[slot, :, s:s + n] = k[b, :, :n]
            cv[slot, :, s:s + n] = v[b, :, :n]

    def clean(self, slots: list[int], total_len: int) -> None:
        """Zeroes, in every layer, the entries [0, total_len) of these slots that were never written,
        so that a reader of that range sees finite values (a forward calls it before its writes). It
        zeroes CLEAN_AHEAD entries more at a time: a decoding slot reads one entry further each step,
        and two strided fills per slot and step cost ~0.3 ms in a batch of 8."""
        for slot in slots:
            if self._clean[slot] < total_len:
                end = min(self.max_len, total_len + CLEAN_AHEAD)
                self.k[:, slot, :, self._clean[slot]:end] = 0
                self.v[:, slot, :, self._clean[slot]:end] = 0
                self._clean[slot] = end

    def set_length(self, slot: int, length: int) -> None:
        assert 0 <= length <= self.max_len
        self.lengths[slot] = length

    def read(self, slot: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Host copies of entries [0, n) of a slot: k, v [layers, Hkv, n, D]."""
        out = []
        for t in (self.k, self.v):
            c = torch.empty((t.shape[0], t.shape[2], n, t.shape[4]), dtype=t.dtype, device="cpu")
            c.copy_(t[:, slot, :, :n])
            out.append(c)
        return out[0], out[1]

    def load(self, slot: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Writes k, v [layers, Hkv, n, D] (as ``read`` returns them) as entries [0, n) of a slot; does
        not change its length."""
        n = k.shape[2]
        self.k[:, slot, :, :n].copy_(k)
        self.v[:, slot, :, :n].copy_(v)
        self._clean[slot] = max(self._clean[slot], n)

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        """Copies entries [0, n) of slot ``src`` into slot ``dst`` (every layer); does not change lengths."""
        self.load(dst, self.k[:, src, :, :n], self.v[:, src, :, :n])

    def move(self, slot: int, src: list[int], dst_start: int) -> None:
        """Copies cache entries at indices ``src`` to ``dst_start ..`` (commits an accepted tree path)."""
        if src == list(range(dst_start, dst_start + len(src))):
            return
        idx = torch.tensor(src, device=self.k.device)
        n = len(src)
        self.k[:, slot, :, dst_start:dst_start + n] = self.k[:, slot, :, idx]
        self.v[:, slot, :, dst_start:dst_start + n] = self.v[:, slot, :, idx]
