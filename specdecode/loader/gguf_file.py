"""The GGUF file format (llama.cpp's): the header, metadata and tensor table parsed here (not by
``gguf.GGUFReader``, which spends ~7 s on a 150k-token vocabulary), tensor data memory-mapped and handed
out as raw block bytes. gguf_loader.py turns them into a model."""
from __future__ import annotations

import math
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as QType

from ..errors import ModelFileError, UnsupportedModelError

SUPPORTED_TYPES = frozenset(QType[n] for n in (
    "F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"))
_NUMERIC = {k: np.dtype(v) for k, v in {0: "u1", 1: "i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4",
                                         7: "?", 10: "<u8", 11: "<i8", 12: "<f8"}.items()}
_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")


@dataclass(frozen=True)
class GGUFTensorInfo:
    name: str  # llama.cpp name, e.g. "blk.0.attn_q.weight"
    qtype: QType
    shape: tuple[int, ...]  # torch order, rows first: [out, in] for a matrix (GGUF's ne order reversed)
    offset: int  # absolute byte offset in the file
    nbytes: int
    row_bytes: int  # bytes per row: the last dim is contiguous and holds the quantization blocks


class _Reader:
    """Bounds-checked little-endian cursor over the header bytes."""

    def __init__(self, buf, path: Path, pos: int):
        self.buf, self.pos, self.path = buf, pos, path

    def skip(self, n: int) -> int:  # -> where the n bytes start
        if self.pos + n > len(self.buf):
            raise ModelFileError(f"{self.path}: truncated or corrupt GGUF header")
        self.pos += n
        return self.pos - n

    def uint(self, s: struct.Struct = _U64) -> int:
        return s.unpack_from(self.buf, self.skip(s.size))[0]

    def string(self) -> str:
        return self.strings(1)[0]

    def value(self, vtype: int):
        if vtype in _NUMERIC:
            dt = _NUMERIC[vtype]
            v = np.frombuffer(self.buf, dt, 1, self.skip(dt.itemsize))[0].item()
            return float(str(np.float32(v))) if vtype == 6 else v  # 1e-05, not 9.99999974738e-06
        if vtype == 8:
            return self.string()
        if vtype != 9:  # array
            raise ModelFileError(f"{self.path}: corrupt GGUF header (value type {vtype})")
        etype, count = self.uint(_U32), self.uint()
        if etype in _NUMERIC:  # numeric arrays (token scores, types) stay numpy, read in one go
            dt = _NUMERIC[etype]
            return np.frombuffer(self.buf, dt, count, self.skip(count * dt.itemsize)).copy()
        if etype == 8:
            return self.strings(count)
        return [self.value(etype) for _ in range(count)]

    def strings(self, count: int) -> list[str]:
        """``count`` strings (each a uint64 length and UTF-8 bytes) in one loop: a vocabulary and its
        merges are ~300k strings, and a call per string was most of a file's parse."""
        buf, pos, end, unpack = self.buf, self.pos, len(self.buf), _U64.unpack_from
        out = []
        for _ in range(count):
            if pos + 8 > end or pos + 8 + (n := unpack(buf, pos)[0]) > end:
                raise ModelFileError(f"{self.path}: truncated or corrupt GGUF header")
            out.append(buf[pos + 8:pos + 8 + n].decode("utf-8", errors="surrogateescape"))
            pos += 8 + n
        self.pos = pos
        return out


class GGUFFile:
    """A parsed GGUF file: ``metadata`` {key: value}, ``tensors`` {llama.cpp name: GGUFTensorInfo}, the
    data memory-mapped (copy-on-write, so torch can wrap it without a copy or a read-only warning)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        if not self.path.is_file():
            raise ModelFileError(f"{self.path}: no such GGUF file")
        if (size := self.path.stat().st_size) < 24:
            raise ModelFileError(f"{self.path}: not a GGUF file (only {size} bytes)")
        try:
            with open(self.path, "rb") as f:
                self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        except OSError as e:
            raise ModelFileError(f"{self.path}: cannot read ({e.strerror or e})") from None
        if self._mm[:4] != b"GGUF":
            raise ModelFileError(f"{self.path}: not a GGUF file (bad magic)")
        r = _Reader(self._mm, self.path, pos=4)
        if (version := r.uint(_U32)) not in (2, 3):
            raise ModelFileError(f"{self.path}: unsupported GGUF version {version} (need 2 or 3)")
        n_tensors, n_kv = r.uint(), r.uint()  # corrupt counts end in a bounds error below
        self.metadata = {r.string(): r.value(r.uint(_U32)) for _ in range(n_kv)}  # key is read first
        infos = []  # (name, shape, type id, offset from the data start)
        for _ in range(n_tensors):
            name, ndim = r.string(), r.uint(_U32)
            if ndim > 8:
                raise ModelFileError(f"{self.path}: corrupt GGUF header ({ndim} dims for {name})")
            infos.append((name, tuple(reversed([r.uint() for _ in range(ndim)])), r.uint(_U32), r.uint()))
        align = int(self.metadata.get("general.alignment", 32))
        self.data_start = (r.pos + align - 1) // align * align
        self.tensors = {n: self._info(n, shape, t, off) for n, shape, t, off in infos}
        need = max((i.offset + i.nbytes for i in self.tensors.values()), default=self.data_start)
        if need > size:
            raise ModelFileError(f"{self.path}: truncated: tensor data needs {need} bytes, file has {size}")

    def _info(self, name: str, shape: tuple[int, ...], type_id: int, off: int) -> GGUFTensorInfo:
        try:
            qtype = QType(type_id)
            block, type_size = GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError):
            raise UnsupportedModelError(f"{self.path}: unknown GGUF tensor type id {type_id} (tensor {name})") from None
        if not shape or shape[-1] % block:
            raise ModelFileError(f"{self.path}: corrupt GGUF header (shape {list(shape)} of {name})")
        row_bytes = shape[-1] // block * type_size
        return GGUFTensorInfo(name, qtype, shape, self.data_start + off, math.prod(shape[:-1]) * row_bytes, row_bytes)

    def raw(self, info: GGUFTensorInfo) -> np.ndarray:
        """The stored bytes as uint8 [rows, row_bytes] (rows = prod(shape[:-1])), a view on the file."""
        return np.frombuffer(self._mm, np.uint8, info.nbytes, info.offset).reshape(-1, info.row_bytes)

    def release(self, info: GGUFTensorInfo) -> None:
        """Drops a consumed tensor's file pages from this process's resident set (they stay in the OS
        page cache): a load then peaks near the model's own size, not model + file."""
        if not hasattr(mmap, "MADV_DONTNEED"):
            return
        page = mmap.PAGESIZE
        start = info.offset // page * page
        end = -(-(info.offset + info.nbytes) // page) * page
        try:
            self._mm.madvise(mmap.MADV_DONTNEED, start, min(end, len(self._mm)) - start)
        except (OSError, ValueError):
            pass  # advisory only


Source = str | os.PathLike | GGUFFile  # a path, or a file already parsed (read_gguf_config + tensors)


def open_gguf(source: Source) -> GGUFFile:
    """source parsed (a path), or as it is (a GGUFFile)."""
    return source if isinstance(source, GGUFFile) else GGUFFile(source)


def gguf_tensor_infos(source: Source) -> Iterator[tuple[GGUFTensorInfo, np.ndarray]]:
    """Raw access for quantized execution: (info, uint8 [rows, row_bytes] view) per tensor, file order."""
    f = open_gguf(source)
    return ((info, f.raw(info)) for info in f.tensors.values())
