"""The OpenMP pool release (kernels/threads.c): a thread that built the engine frees its pool, so that
the thread stepping it (the server's worker) is the only one libgomp manages besides its own workers
(more threads than CPUs would throttle its spin-waiting; that is a speed, not tested here)."""
import os
import threading

import pytest
import torch

from specdecode.engine.engine import release_threads
from specdecode.kernels import native_kernels

pytestmark = pytest.mark.skipif(native_kernels() is None or not os.path.isdir("/proc/self/task"),
                                reason="native kernels or /proc unavailable here")


def _tasks() -> int:
    return len(os.listdir("/proc/self/task"))


def _parallel_work():
    x = torch.randn(1 << 22)
    for _ in range(3):
        torch.exp(x)  # large enough for PyTorch's OpenMP parallel_for


def test_release_frees_the_calling_threads_pool():
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        out = []

        def run():  # a fresh thread: its pool is its own
            before = _tasks()
            _parallel_work()
            with_pool = _tasks()
            release_threads()
            out.append((before, with_pool, _tasks()))
            _parallel_work()  # parallel work after a release builds a new pool and runs
            out.append(_tasks())

        t = threading.Thread(target=run)
        t.start()
        t.join()
        (before, with_pool, after), rebuilt = out
        assert with_pool == before + 1  # one worker beside the thread itself
        assert after == before
        assert rebuilt == with_pool
    finally:
        torch.set_num_threads(threads)
