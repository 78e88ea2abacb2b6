"""Wall-clock timing for the cost model: perf_counter, with a device sync where work is asynchronous."""
from __future__ import annotations

import time
from typing import Callable

import torch


class Timer:
    """perf_counter with a device sync where timings would otherwise be asynchronous (CUDA)."""

    def __init__(self, device):
        self.cuda = getattr(device, "type", str(device)) == "cuda"

    def now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    def best_of(self, fn: Callable[[], object], reps: int = 3) -> float:
        """The shortest of ``reps`` timed calls of fn (the least disturbed by other work on the host)."""
        best = float("inf")
        for _ in range(reps):
            t0 = self.now()
            fn()
            best = min(best, self.now() - t0)
        return best
