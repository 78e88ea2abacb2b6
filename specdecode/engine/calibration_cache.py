"""The target's calibrated verify cost curve, kept on disk from one engine to the next.

Before its first decision an engine with a drafter measures the target's forward over t = 1..K+1
tokens (DraftPlanner.calibrate): ~1.5 s for the 1.5B int4 on a 2-core CPU, paid by every fresh engine
(each ``specdecode generate``) for a curve that is the same from run to run on one machine. So the curve
is saved under a key of what it depends on (``calibration_key``: the model file, its weight format, the
activation and KV types, the attention backend, the thread count, the native kernels' build, the CPU,
specdecode's version) and the next engine with that key starts from it.

A saved curve is taken without a forward of its own, so a fresh engine's first token comes as soon as
with ``--spec-type none``, and checked by the engine's first verify forwards of one sequence at a short
context (CHECK_CONTEXT: the curve is measured after 32 tokens, and attention over thousands of tokens
alone can add half a forward's time): once CHECK_STEPS of them have run at one size, the median of
their times must lie within DRIFT of the saved time for that size, else (the host busier or idler
than when it was saved, or a change the key does not see) the saved curve is discarded and the next
engine measures its own. Either way every verify forward refines the curve online
(controller.CostModel), as it refines a measured one. A cache that cannot be read or written is no
error: the engine measures, as it would without one."""
from __future__ import annotations

import hashlib
import json
import logging
import statistics
from importlib import metadata
from pathlib import Path

import torch

from ..kernels import cpu_key, native_kernels
from ..store import cache_dir, file_identity, replacing

log = logging.getLogger(__name__)

DRIFT = 1.5  # a saved curve is kept while the first forwards' times are within this factor of it
CHECK_STEPS = 4  # verify forwards of one size whose median checks a saved curve
CHECK_CONTEXT = 512  # ... each after at most this many tokens (where attention adds little to a forward)
VERSION = 1  # of the file's layout


def _version() -> str:
    try:
        return metadata.version("specdecode")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def calibration_key(model_path: str | Path, **parts) -> dict:
    """What a cost curve depends on: the model file (path, size, modification time: a replaced file is
    another model), the CPU, specdecode's version and ``parts`` (weight format, types, backend,
    threads, kernels' build: whatever the engine runs the model with). The sizes a curve holds are
    checked on reading it (``load``), not keyed: a longer draft cap needs sizes a saved curve lacks."""
    return {**file_identity(model_path), "cpu": cpu_key(),
            "specdecode": _version(), "layout": VERSION, **{k: parts[k] for k in sorted(parts)}}


class CalibrationCache:
    """One key's saved curve: {verify tokens t: seconds of a one-sequence forward over t tokens}."""

    def __init__(self, key: dict, directory: str | Path):
        self.key = key
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
        self.path = Path(directory) / f"{digest}.json"

    def load(self, points: list[int]) -> dict[int, float] | None:
        """The saved curve if it was saved under this key and holds every size in ``points``, else None."""
        try:
            data = json.loads(self.path.read_text())
            curve = {int(t): float(s) for t, s in data["curve"].items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None
        if data.get("key") != self.key or any(t not in curve or not curve[t] > 0 for t in points):
            return None
        return curve

    def check(self, curve: dict[int, float], tokens: int, measured: list[float]) -> None:
        """The engine's first verify forwards over ``tokens`` tokens took ``measured`` seconds (one
        sequence): the saved curve is discarded unless their median is within DRIFT of its time."""
        mid = statistics.median(measured)
        if not curve[tokens] / DRIFT <= mid <= curve[tokens] * DRIFT:
            log.info("saved cost curve discarded: %d-token forwards took %.1f ms, not %.1f ms", tokens,
                     1e3 * mid, 1e3 * curve[tokens])
            self.path.unlink(missing_ok=True)

    def save(self, curve: dict[int, float]) -> None:
        """Writes the curve atomically (a concurrent engine reads the old file or the new one, whole)."""
        try:
            data = {"key": self.key, "curve": {str(t): s for t, s in sorted(curve.items())}}
            with replacing(self.path, ".json") as tmp:
                Path(tmp).write_text(json.dumps(data, indent=1))
        except OSError as exc:
            log.debug("cost curve not saved to %s: %s", self.path, exc)


def engine_cache(model_path: str | Path, quant: str, dtype, kv_dtype, device, attention: str) -> CalibrationCache:
    """The cache of an engine that runs the model file at ``model_path`` with these weights (quant),
    types and attention backend, on this process's threads and native kernels."""
    native = native_kernels()
    dev = torch.device(device)
    key = calibration_key(model_path, quant=quant, dtype=str(dtype), kv_dtype=str(kv_dtype), attention=attention,
                          device=torch.cuda.get_device_name(dev) if dev.type == "cuda" else dev.type,
                          threads=torch.get_num_threads(), kernels=native.build if native else None)
    return CalibrationCache(key, cache_dir() / "costs")
