"""A quantized GGUF model's weights as specdecode runs them, kept on disk for the next load.

Loading a Q4_K_M file converts every tensor: the file's 4-bit blocks and 6-bit sub-scales re-laid into
the native kernels' tiles, its Q6_K and Q8_0 tensors requantized. That is ~6 s of the 1.5B's ~7.5 s
load on a 2-core CPU, repeated by every ``specdecode generate`` for the same result. So the converted
tensors (the model's state: ~0.9 GB for the 1.5B) are saved once, under a key of what decides them (the
model file, the weight format, the dtype, each layer's kernel, the conversion code itself), and the next
load maps the file instead: the model's tensors are copy-on-write views of it (``map``). Nothing is
copied, and processes running the same model share its pages. Where the page cache holds the file in
2 MiB folios (ext4, xfs on recent kernels) the kernel maps those with huge-page entries, which a decode
step streams faster (as runtime/host_memory.py's arena): ``save`` writes whole 2 MiB blocks, which leaves
the new entry in such folios, and the mapping is marked MADV_HUGEPAGE, which has a later read of an
evicted entry fill them too. Like llama.cpp's mapped GGUF, the pages are the file's: under memory
pressure the kernel may drop them and read them again. Where the file cannot be mapped (a filesystem
without mmap), ``read`` copies it into allocated tensors instead.

The file is safetensors (an 8-byte header length, a JSON header giving each tensor's dtype, shape and
byte range, the bytes), written by ``save`` with every tensor on a 64-byte line (padding entries named
``__pad__.*`` between them, so that the file stays valid safetensors): the kernels' weight loads want
whole lines. Entries are kept per model file name and weight format, the KEEP most recently used (two
installs of specdecode, or an A/B of two checkouts, do not evict each other at every load). A cache that
cannot be read or written is no error: the model is converted from the file, as without one."""
from __future__ import annotations

import functools
import glob
import hashlib
import json
import logging
import mmap
import os
import struct
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterator

import torch
from torch import nn

from ..store import file_identity, replacing

log = logging.getLogger(__name__)

# the code that decides the converted tensors: a change there is another conversion
_CODE = ("layers", "kernels", "loader", "models")
KEEP = 2  # entries kept per model file name and format (the most recently used)
ALIGN = 64  # every tensor's bytes start on a cache line of the file (and so of its mapping)
_PAD = "__pad__."  # names of the padding entries between tensors
BLOCK = 2 << 20  # bytes per write of an entry (a huge page)
_DTYPES = {torch.uint8: "U8", torch.int8: "I8", torch.int16: "I16", torch.int32: "I32", torch.int64: "I64",
           torch.float16: "F16", torch.bfloat16: "BF16", torch.float32: "F32", torch.bool: "BOOL"}  # safetensors' names


@functools.cache  # the source files do not change under a running process
def _code_digest() -> str:
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for path in sorted(p for d in _CODE for p in (root / d).rglob("*") if p.suffix in (".py", ".c", ".h")):
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def _write_blocks(f, pieces) -> None:
    """Writes the concatenated ``pieces`` in whole BLOCK-sized writes at BLOCK offsets (the last one
    shorter): ext4 and xfs then keep the file's pages in 2 MiB folios, which the next load's mapping
    takes as huge pages (smaller or unaligned writes leave 4 KiB ones)."""
    block, fill = bytearray(BLOCK), 0
    for piece in pieces:
        view = memoryview(piece).cast("B")
        while len(view):
            n = min(len(view), BLOCK - fill)
            block[fill:fill + n] = view[:n]
            fill, view = fill + n, view[n:]
            if fill == BLOCK:
                f.write(block)
                fill = 0
    if fill:
        f.write(memoryview(block)[:fill])


class WeightCache:
    """Converted weights of the GGUF file at ``model_path``, under ``directory``."""

    def __init__(self, model_path: str | Path, directory: str | Path):
        self.model_path, self.directory = Path(model_path).resolve(), Path(directory)

    def _key(self, model: torch.nn.Module) -> dict:
        # entries hold CPU models (the loader's only use); the model may still be on the meta device
        kernels = sorted({f"{type(m).__name__}:{m.kernel}" for m in model.modules() if hasattr(m, "kernel")})
        return {**file_identity(self.model_path), "quant": model.quant, "dtype": str(model.dtype),
                "device": "cpu", "kernels": kernels, "code": _code_digest()}

    def _file(self, key: dict) -> Path:
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
        return self.directory / f"{self.model_path.stem}-{key['quant']}-{digest}.safetensors"

    @contextmanager
    def _entry(self, model: torch.nn.Module) -> Iterator[tuple[Path, BinaryIO, dict[str, int]] | None]:
        """The saved entry that matches ``model``, open: (its path, the file, each tensor's byte offset in
        it); None where none matches the model's key, names, shapes and types, or a tensor lies off its
        line or past the file's end."""
        key = self._key(model)
        path = self._file(key)
        if not path.exists():
            yield None
            return
        state = model.state_dict()
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
            meta = header.pop("__metadata__", None) or {}
            offsets: dict[str, int] | None = {}
            if (json.loads(meta.get("key", "null")) != key
                    or {k for k in header if not k.startswith(_PAD)} != set(state)):
                offsets = None
            size = os.fstat(f.fileno()).st_size
            for name, t in state.items() if offsets is not None else ():
                h = header[name]
                begin, end = (8 + n + o for o in h["data_offsets"])
                if (h["dtype"] != _DTYPES.get(t.dtype) or h["shape"] != list(t.shape) or begin % ALIGN
                        or end - begin != t.numel() * t.element_size() or end > size):
                    offsets = None
                    break
                offsets[name] = begin
            yield None if offsets is None else (path, f, offsets)

    def map(self, model: torch.nn.Module) -> bool:
        """Gives every tensor of ``model`` (built by build_model(allocate=False): all on the meta device)
        a copy-on-write view of the saved file; False, with the model untouched, where no entry matches
        (``_entry``) or the file cannot be mapped."""
        try:
            with self._entry(model) as entry:
                if entry is None:
                    return False
                path, f, offsets = entry
                mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
                if hasattr(mmap, "MADV_HUGEPAGE"):  # page faults read the file in 2 MiB folios
                    mapped.madvise(mmap.MADV_HUGEPAGE)
            for name, dst in model.state_dict().items():
                view = (torch.frombuffer(mapped, dtype=dst.dtype, count=dst.numel(), offset=offsets[name])
                        .view(dst.shape) if dst.numel() else torch.empty(dst.shape, dtype=dst.dtype))
                owner, _, attr = name.rpartition(".")
                module = model.get_submodule(owner)
                if attr in module._parameters:
                    module._parameters[attr] = nn.Parameter(view, requires_grad=False)
                else:
                    module._buffers[attr] = view
            os.utime(path)  # used: the last to be evicted
        except (OSError, ValueError, KeyError, TypeError, struct.error) as exc:
            log.debug("converted weights not mapped: %s", exc)
            return False
        return True

    def read(self, model: torch.nn.Module) -> bool:
        """Reads the saved tensors into ``model``'s allocated ones: for an entry that ``map`` found but
        could not map (a filesystem without mmap). False where no entry matches (the model may then hold
        some of them: the caller converts it from the file, which writes every tensor)."""
        try:
            with self._entry(model) as entry:
                if entry is None:
                    return False
                path, f, offsets = entry
                for name, dst in model.state_dict().items():
                    size = dst.numel() * dst.element_size()
                    if not dst.is_contiguous():
                        return False
                    f.seek(offsets[name])
                    if size and f.readinto(memoryview(dst.reshape(-1).view(torch.uint8).numpy())) != size:
                        return False
            os.utime(path)
        except (OSError, ValueError, KeyError, TypeError, struct.error) as exc:
            log.debug("converted weights not read: %s", exc)
            return False
        return True

    def save(self, model: torch.nn.Module) -> None:
        """Saves the model's state (atomically: a concurrent load reads the old file or the new one)
        and removes the entries for the same model file name and format beyond the KEEP most recently
        used."""
        try:
            key = self._key(model)
            path = self._file(key)
            state = {n: t.contiguous() for n, t in model.state_dict().items()}
            header, offset = {}, 0
            for name, t in state.items():
                pad = -offset % ALIGN
                if pad:
                    header[f"{_PAD}{len(header)}"] = {"dtype": "U8", "shape": [pad],
                                                       "data_offsets": [offset, offset + pad]}
                    offset += pad
                nbytes = t.numel() * t.element_size()
                header[name] = {"dtype": _DTYPES[t.dtype], "shape": list(t.shape),
                                "data_offsets": [offset, offset + nbytes]}
                offset += nbytes
            header["__metadata__"] = {"key": json.dumps(key, sort_keys=True)}
            text = json.dumps(header).encode()
            text += b" " * (-(8 + len(text)) % ALIGN)  # the bytes start on a line (safetensors allows the spaces)
            def pieces():
                yield struct.pack("<Q", len(text)) + text
                at = 0
                for name, t in state.items():
                    begin, end = header[name]["data_offsets"]
                    if begin > at:
                        yield bytes(begin - at)
                    if t.numel():
                        yield memoryview(t.reshape(-1).view(torch.uint8).numpy())
                    at = end

            with replacing(path) as tmp, open(tmp, "wb") as f:
                _write_blocks(f, pieces())
            entries = self.directory.glob(f"{glob.escape(self.model_path.stem)}-{key['quant']}-*.safetensors")
            for old in sorted(entries, key=lambda p: p.stat().st_mtime, reverse=True)[KEEP:]:
                old.unlink(missing_ok=True)
        except (OSError, KeyError) as exc:  # e.g. a full or read-only disk
            log.debug("converted weights not saved: %s", exc)
