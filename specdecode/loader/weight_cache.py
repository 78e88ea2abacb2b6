"""A quantized GGUF model's weights as specdecode runs them, kept on disk for the next load.

Loading a Q4_K_M file converts every tensor: the file's 4-bit blocks and 6-bit sub-scales re-laid into
the native kernels' tiles, its Q6_K and Q8_0 tensors requantized. That is ~6 s of the 1.5B's ~7.5 s
load on a 2-core CPU, repeated by every ``specdecode generate`` for the same result. So the converted
tensors (the model's state: ~0.9 GB for the 1.5B) are saved once as safetensors, under a key of what
decides them (the model file, the weight format, the dtype, each layer's kernel, the conversion code
itself), and the next load copies them in instead. Entries are kept per model file name and weight
format, the KEEP most recently used (two installs of specdecode, or an A/B of two checkouts, do not
evict each other at every load). A cache that cannot be read or written is no error: the model is
converted from the file, as without one."""
from __future__ import annotations

import functools
import glob
import hashlib
import json
import logging
import os
import struct
from pathlib import Path

import torch

from ..store import file_identity, replacing

log = logging.getLogger(__name__)

# the code that decides the converted tensors: a change there is another conversion
_CODE = ("layers", "kernels", "loader", "models")
KEEP = 2  # entries kept per model file name and format (the most recently used)
_DTYPES = {torch.uint8: "U8", torch.int8: "I8", torch.int16: "I16", torch.int32: "I32", torch.int64: "I64",
           torch.float16: "F16", torch.bfloat16: "BF16", torch.float32: "F32", torch.bool: "BOOL"}  # safetensors' names


@functools.cache  # the source files do not change under a running process
def _code_digest() -> str:
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for path in sorted(p for d in _CODE for p in (root / d).rglob("*") if p.suffix in (".py", ".c", ".h")):
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


class WeightCache:
    """Converted weights of the GGUF file at ``model_path``, under ``directory``."""

    def __init__(self, model_path: str | Path, directory: str | Path):
        self.model_path, self.directory = Path(model_path).resolve(), Path(directory)

    def _key(self, model: torch.nn.Module) -> dict:
        kernels = sorted({f"{type(m).__name__}:{m.kernel}" for m in model.modules() if hasattr(m, "kernel")})
        return {**file_identity(self.model_path), "quant": model.quant, "dtype": str(model.dtype),
                "device": model.device.type, "kernels": kernels, "code": _code_digest()}

    def _file(self, key: dict) -> Path:
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
        return self.directory / f"{self.model_path.stem}-{key['quant']}-{digest}.safetensors"

    def fill(self, model: torch.nn.Module) -> bool:
        """Reads the saved tensors into ``model`` (built by build_model, not loaded); False where no
        entry matches its key, names, shapes and types (the model may then hold some of them: the
        caller loads it from the file, which writes every tensor).

        Each tensor's bytes are read straight into the model's own buffer. safetensors' reader maps
        the whole file and returns new tensors: the mapped pages (0.9 GB for the 1.5B) then count
        towards the process's memory beside the model until the file is closed, a copy follows, and
        its tensors sit 16 bytes off the 64-byte boundary the kernels' weight loads want. The format
        is an 8-byte header length, a JSON header (each tensor's dtype, shape and byte range after
        it) and the bytes."""
        try:
            key = self._key(model)
            path = self._file(key)
            if not path.exists():
                return False
            state = model.state_dict()
            with open(path, "rb") as f:
                (n,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(n))
                meta = header.pop("__metadata__", None) or {}
                if json.loads(meta.get("key", "null")) != key or set(header) != set(state):
                    return False
                for name, dst in state.items():
                    h, size = header[name], dst.numel() * dst.element_size()
                    begin, end = h["data_offsets"]
                    if (h["dtype"] != _DTYPES.get(dst.dtype) or h["shape"] != list(dst.shape) or end - begin != size
                            or not dst.is_contiguous()):
                        return False
                    f.seek(8 + n + begin)
                    if f.readinto(memoryview(dst.reshape(-1).view(torch.uint8).numpy())) != size:
                        return False
            os.utime(path)  # used: the last to be evicted
        except (OSError, ValueError, KeyError, TypeError, struct.error) as exc:
            log.debug("converted weights not read: %s", exc)
            return False
        return True

    def save(self, model: torch.nn.Module) -> None:
        """Saves the model's state (atomically: a concurrent load reads the old file or the new one)
        and removes the entries for the same model file name and format beyond the KEEP most recently
        used."""
        from safetensors import SafetensorError
        from safetensors.torch import save_file

        try:
            key = self._key(model)
            path = self._file(key)
            with replacing(path) as tmp:
                save_file({n: t.contiguous() for n, t in model.state_dict().items()}, tmp,
                          metadata={"key": json.dumps(key, sort_keys=True)})
            entries = self.directory.glob(f"{glob.escape(self.model_path.stem)}-{key['quant']}-*.safetensors")
            for old in sorted(entries, key=lambda p: p.stat().st_mtime, reverse=True)[KEEP:]:
                old.unlink(missing_ok=True)
        except (OSError, SafetensorError) as exc:  # e.g. a full or read-only disk
            log.debug("converted weights not saved: %s", exc)
