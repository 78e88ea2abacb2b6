"""Host memory for what a decode step streams: a model's weights, in transparent huge pages.

Why: a CPU decode step reads every weight once, at the memory's bandwidth. In 4 KiB pages that stream
takes a TLB miss and a page walk every 4 KiB, and the hardware prefetchers stop at each page's end; in
2 MiB pages the same forwards took 0.92-1.0x the time (docs/benchmarks.md, round 34). Linux gives
anonymous memory huge pages where the process marks it with madvise(MADV_HUGEPAGE) before first touching
it (the "madvise" mode of /sys/kernel/mm/transparent_hugepage/enabled, the common default); under
"always" it needs no mark, under "never" (or off Linux) the mark is ignored and the memory is ordinary
pages: nothing else changes.

Faulting the pages in: on bare metal a huge page's first touch costs its zeroing (~0.05 ms per MiB),
but in a virtual machine whose balloon reports free memory to the host (free page reporting, as
Firecracker guests do) a huge page mostly comes from memory the host has taken back, and its first touch
waits for the host (~1-3 ms per MiB: seconds for a 1.5B model, more than decoding gains in a short run).
So an arena faults its pages in itself, CHUNK bytes at a time, timed: from the first chunk that takes
longer than CHUNK_LIMIT, the rest is marked MADV_NOHUGEPAGE and fills in ordinary pages.
SPECDECODE_HUGEPAGES=on keeps huge pages however slowly they fault in (a long-lived server on such a
VM: seconds once, a few percent of every forward after), =off allocates ordinary tensors.

An arena is one anonymous mapping holding many tensors back to back, each on a 64-byte line: huge pages
are whole 2 MiB, so a mapping per tensor would round each of a model's ~200 tensors up to one. A tensor
keeps its arena mapped (``torch.frombuffer`` holds the buffer) until the last tensor cut from it is freed.

Not for the KV cache: it is touched lazily, slot by slot, and a huge page would make one written entry
commit 2 MiB of idle slots."""
from __future__ import annotations

import mmap
import os
import time

import torch

HUGE_PAGE = 2 << 20
ALIGN = 64  # every tensor starts on a cache line (the native kernels' loads)
CHUNK = 8 * HUGE_PAGE  # bytes faulted in and timed at a time
CHUNK_LIMIT = 0.004  # seconds per chunk: 0.25 ms per MiB, ~5x bare metal's zeroing, below a host's faults
_MODE = os.environ.get("SPECDECODE_HUGEPAGES", "auto").lower()
ENABLED = _MODE != "off"  # False: ordinary torch.empty
if _MODE == "on":
    CHUNK_LIMIT = float("inf")


def _up(n: int, to: int) -> int:
    return -(-n // to) * to


class Arena:
    """Room for tensors of ``nbytes`` bytes in all, cut in order by ``empty``. Uninitialised, like torch.empty.
    ``limit``: seconds per chunk past which the rest falls back to ordinary pages (default CHUNK_LIMIT;
    infinity keeps huge pages however slowly they fault in, as a benchmark's buffer wants)."""

    def __init__(self, nbytes: int, limit: float | None = None):
        self._limit = CHUNK_LIMIT if limit is None else limit
        # one spare huge page so that the tensors can start on a huge-page boundary of the mapping
        self._map = mmap.mmap(-1, _up(nbytes, ALIGN) + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        base = torch.frombuffer(self._map, dtype=torch.uint8, count=1).data_ptr()
        self._next = (-base) % HUGE_PAGE
        self.huge = self._advise()  # whether the arena asked for huge pages and kept them to its end

    def _advise(self) -> bool:
        if not hasattr(mmap, "MADV_HUGEPAGE"):
            return False
        try:
            self._map.madvise(mmap.MADV_HUGEPAGE)
        except OSError:  # a kernel without transparent huge pages: ordinary pages
            return False
        off = self._next
        while off < len(self._map):
            end = min(off + CHUNK, len(self._map))
            t0 = time.perf_counter()
            for page in range(off, end, HUGE_PAGE):  # one write faults a whole huge page in
                self._map[page] = 0
            if time.perf_counter() - t0 > self._limit:
                if end < len(self._map):  # end is on a huge page, so on a page boundary
                    self._map.madvise(mmap.MADV_NOHUGEPAGE, end, len(self._map) - end)
                return False
            off = end
        return True

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        numel = 1
        for s in shape:
            numel *= s
        nbytes = numel * dtype.itemsize
        if nbytes == 0 or self._next + nbytes > len(self._map):
            return torch.empty(shape, dtype=dtype)
        t = torch.frombuffer(self._map, dtype=dtype, count=numel, offset=self._next).view(shape)
        self._next = _up(self._next + nbytes, ALIGN)
        return t


def allocate(module: torch.nn.Module, device: torch.device | str) -> torch.nn.Module:
    """Every parameter and buffer of ``module`` (on the meta device) allocated on ``device``, uninitialised,
    in its own dtype; on the CPU in one arena of huge pages (torch.empty where ENABLED is False)."""
    if torch.device(device).type != "cpu" or not ENABLED:
        return module._apply(lambda t: torch.empty(t.shape, dtype=t.dtype, device=device))
    sizes: list[int] = []

    def measure(t: torch.Tensor) -> torch.Tensor:
        sizes.append(_up(t.numel() * t.element_size(), ALIGN))
        return t

    module._apply(measure)  # the same tensors, in the order the allocating pass visits them
    arena = Arena(sum(sizes))
    return module._apply(lambda t: arena.empty(tuple(t.shape), t.dtype))
