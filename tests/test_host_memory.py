"""A model's weights in one arena of transparent huge pages (runtime/host_memory.py): tensors that do not
overlap and outlive the arena object, huge pages where the kernel gives them, and ordinary pages from
the first chunk that faults in too slowly."""
from __future__ import annotations

import gc
import sys
from pathlib import Path

import pytest
import torch

from specdecode.models import build_model
from specdecode.models.config import ModelConfig
from specdecode.runtime import host_memory

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def thp_available() -> bool:
    return sys.platform == "linux" and THP.exists() and "[never]" not in THP.read_text()


def mapping_of(address: int) -> dict[str, str]:
    """The /proc/self/smaps fields of the mapping that holds ``address``."""
    fields: dict[str, str] | None = None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:
            lo, hi = (int(x, 16) for x in head.split("-"))
            if fields is not None:
                break
            fields = {} if lo <= address < hi else None
        elif fields is not None:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    assert fields is not None, "address not mapped"
    return fields


def huge_kb(t: torch.Tensor) -> int:
    return int(mapping_of(t.data_ptr())["AnonHugePages"].split()[0])


def test_arena_tensors_do_not_overlap_and_outlive_it():
    arena = host_memory.Arena(3 << 20)
    shapes = [((1000, 7), torch.float32), ((3,), torch.int16), ((1 << 20,), torch.uint8), ((5, 5), torch.bfloat16)]
    ts = [arena.empty(s, d) for s, d in shapes]
    for i, t in enumerate(ts):
        assert t.shape == shapes[i][0] and t.dtype == shapes[i][1] and t.data_ptr() % host_memory.ALIGN == 0
        t.fill_(i + 1)
    spans = sorted((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in ts)
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    overflow = arena.empty((4 << 20,), torch.uint8)  # past the arena's room: an ordinary tensor
    assert overflow.numel() == 4 << 20
    del arena, overflow
    gc.collect()
    for i, t in enumerate(ts):  # the mapping lives as long as a tensor cut from it
        assert bool((t == i + 1).all())


def tiny_config() -> ModelConfig:
    return ModelConfig(arch="llama", vocab_size=4096, hidden_size=512, intermediate_size=1536, num_layers=2,
                       num_heads=8, num_kv_heads=4, head_dim=64)


@pytest.mark.skipif(not thp_available(), reason="no transparent huge pages on this system")
def test_model_weights_lie_in_huge_pages(monkeypatch):
    monkeypatch.setattr(host_memory, "CHUNK_LIMIT", float("inf"))  # however long this machine's faults take
    model = build_model(tiny_config(), quant="int4")
    weights = [t for t in list(model.parameters()) + list(model.buffers()) if t.numel() * t.element_size() > 1 << 16]
    spans = {mapping_of(t.data_ptr()).get("VmFlags") for t in weights}
    assert len(spans) == 1 and "hg" in spans.pop()  # one mapping, marked for huge pages
    assert huge_kb(weights[0]) >= host_memory.HUGE_PAGE >> 10


@pytest.mark.skipif(not thp_available(), reason="no transparent huge pages on this system")
def test_slow_faults_leave_the_rest_in_ordinary_pages(monkeypatch):
    monkeypatch.setattr(host_memory, "CHUNK_LIMIT", 0.0)  # every chunk counts as slow
    arena = host_memory.Arena(4 * host_memory.CHUNK)
    assert not arena.huge
    tail = arena.empty((4 * host_memory.CHUNK,), torch.uint8)[-host_memory.CHUNK:]
    tail.fill_(1)
    fields = mapping_of(tail.data_ptr())
    assert "nh" in fields["VmFlags"] and fields["AnonHugePages"].split()[0] == "0"


def test_disabled_allocates_ordinary_tensors(monkeypatch):
    monkeypatch.setattr(host_memory, "ENABLED", False)
    model = build_model(tiny_config(), quant="int4")
    ptrs = {t.untyped_storage().data_ptr() for t in model.parameters()}
    assert len(ptrs) == len(list(model.parameters()))  # each tensor its own allocation


@pytest.mark.parametrize("mode, enabled, limit", [("off", False, host_memory.CHUNK_LIMIT), ("on", True, float("inf")),
                                                   ("auto", True, host_memory.CHUNK_LIMIT)])
def test_environment_sets_the_mode(mode, enabled, limit):
    import os
    import subprocess

    code = "from specdecode.runtime import host_memory as h; print(h.ENABLED, h.CHUNK_LIMIT)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "SPECDECODE_HUGEPAGES": mode}).stdout.split()
    assert out == [str(enabled), str(limit)]
