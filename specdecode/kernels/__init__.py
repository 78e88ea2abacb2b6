"""Native CPU kernels, compiled on first use with the system C compiler for this machine's CPU.

One library from seven sources (see their headers for why they exist and their exact arithmetic):
``quant_gemm.c``, weight-only int4 and int8 GEMMs (a body per instruction set in ``quant_gemm_avx512.h``
and ``quant_gemm_avx2.h``, the AMX pass in ``quant_gemm_amx.h``); ``attention.c``, batch-invariant
attention over the slot KV cache; ``norm.c``, RMSNorm; ``layer.c``, a whole Llama-family decoder layer in
one call from the other three (``simd.h``: the vector helpers they share; ``share.h``: how the GEMMs'
threads share their tiles; ``layer.py``: its operands);
``argmax.c``, row-wise argmax for greedy tokens; ``sample.c``, inverse-CDF sampling of probability
rows; ``threads.c``, releasing a thread's OpenMP pool. It is
built with ``-march=native`` into a per-user cache keyed by the sources, the compiler and the CPU, and
called through ctypes: no PyTorch headers, so a build takes ~1 s. Where it cannot be built (no
compiler, a CPU without AVX2/AVX512-VNNI, not x86) or ``SPECDECODE_NATIVE_KERNELS=0`` is set, callers
get None from ``native_kernels()`` and use PyTorch's own kernels.

Threads: the library links the same ``libgomp.so.1`` that PyTorch loaded (same soname), so its
parallel loops share PyTorch's OpenMP pool and follow ``torch.set_num_threads``.
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

log = logging.getLogger(__name__)

TILE = 16  # output rows per packed tile (quant_gemm.c)
INT8_GROUP = 32  # activation quantization group of the int8 kernel
_SOURCES = tuple(Path(__file__).with_name(n) for n in ("quant_gemm.c", "attention.c", "norm.c", "layer.c", "argmax.c",
                                                      "sample.c", "threads.c"))
_HEADERS = tuple(Path(__file__).with_name(n) for n in ("simd.h", "share.h", "attention_pairs.h", "quant_gemm_avx512.h",
                                                      "quant_gemm_avx2.h", "quant_gemm_amx.h"))
# No floating-point contraction: attention.c's results must not depend on how the compiler vectorises.
_FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c11", "-ffp-contract=off"]


def _cache_dir() -> Path:
    root = os.environ.get("SPECDECODE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "specdecode")
    return Path(root) / "kernels"


def cpu_key() -> str:
    """The CPU's model and flags, for caches of what depends on the machine (this library's builds, the
    engine's measured cost curve): a cache shared between machines never hands one another's entry."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    keep = [ln for ln in lines if ln.startswith(("model name", "flags"))][:2]
    return "\n".join(keep)


def _build(cc: str, flags: list[str]) -> Path:
    """Compiles the library once per (source, flags, compiler, CPU); concurrent builders race
    harmlessly (each writes a temporary file and renames it into place)."""
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, check=True).stdout
    key = hashlib.sha256("\0".join([*(s.read_text() for s in _SOURCES + _HEADERS), " ".join(flags), version,
                                     cpu_key()]).encode())
    out = _cache_dir() / f"specdecode-{key.hexdigest()[:16]}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        proc = subprocess.run([cc, *flags, *map(str, _SOURCES), "-o", tmp, "-lm"], capture_output=True, text=True)
        if proc.returncode != 0:
            lines = [ln for ln in proc.stderr.splitlines() if "error" in ln] or ["compiler failed"]
            raise RuntimeError(lines[0].strip())
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


@dataclass(frozen=True)
class NativeKernels:
    """The loaded library. Both GEMMs take x float32 contiguous [R, K] and return float32 [R, N]."""
    lib: ctypes.CDLL
    isa: str
    build: str  # the library's file name: a hash of its sources, flags, compiler and CPU

    def int4_gemm(self, x: torch.Tensor, packed: torch.Tensor, sub: torch.Tensor, sup: torch.Tensor, n: int,
                  group_size: int) -> torch.Tensor:
        """packed uint8 [N, K / 2] (pack_int4); sub uint8 [N / 16, K / gs, 2, 16] and sup int16
        [N / 16, K / (gs S), 2, 16], contiguous (store_int4_scales)."""
        r, k = x.shape
        y = torch.empty(r, n)
        # one scratch allocation per call (a decode step makes ~100 of these calls): xq int8 [R, K],
        # then per-group activation scale and sum, float32 [R, K / gs] each
        g = r * (k // group_size)
        scratch = torch.empty(r * k // 4 + 2 * g)
        xq = scratch.data_ptr()
        self.lib.specdecode_int4_gemm(x.data_ptr(), r, k, n, group_size, packed.data_ptr(), sub.data_ptr(),
                                      sup.data_ptr(), y.data_ptr(), xq, xq + r * k, xq + r * k + 4 * g,
                                      torch.get_num_threads())
        return y

    def int8_gemm(self, x: torch.Tensor, packed: torch.Tensor, wscale: torch.Tensor, n: int) -> torch.Tensor:
        """packed uint8 [N, K] (pack_int8); wscale float32 [N]."""
        r, k = x.shape
        y = torch.empty(r, n)
        # xq int8 [R, K]; per-group activation scale, sum and integer sum float32 [R, K / 32]; [R]
        g = r * (k // INT8_GROUP)
        scratch = torch.empty(r * k // 4 + 3 * g + r)
        xq = scratch.data_ptr()
        stats = xq + r * k
        self.lib.specdecode_int8_gemm(x.data_ptr(), r, k, n, packed.data_ptr(), wscale.data_ptr(), y.data_ptr(),
                                      xq, stats, stats + 4 * g, stats + 8 * g, stats + 12 * g,
                                      torch.get_num_threads())
        return y


    def attention(self, q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, slots: torch.Tensor,
                  nkeys: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """q float32 contiguous [B, H, T, D]; kc, vc one layer of the cache [S, Hkv, Lmax, D] (bfloat16
        or float32, contiguous); slots int32 [B]; nkeys int32 [B, T]; mask uint8 [B, T, Lm] or None
        (attention.c). Returns o float32 [B, H, T, D]."""
        B, H, T, D = q.shape
        o = torch.empty_like(q)
        lm = mask.shape[-1] if mask is not None else 0
        rc = self.lib.specdecode_attention(
            q.data_ptr(), kc.data_ptr(), vc.data_ptr(), int(kc.dtype == torch.bfloat16), B, H, kc.shape[1], T, D,
            kc.shape[2], slots.data_ptr(), nkeys.data_ptr(), mask.data_ptr() if mask is not None else None, lm,
            D ** -0.5, o.data_ptr(), torch.get_num_threads())
        if rc != 0:
            raise MemoryError("native attention: scratch allocation failed")
        return o


    def rmsnorm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """x float32 contiguous [..., D] (D % 8 == 0), weight float32 [D] -> float32 [..., D]."""
        y = torch.empty_like(x)
        self.lib.specdecode_rmsnorm(x.data_ptr(), weight.data_ptr(), y.data_ptr(), x.numel() // x.shape[-1],
                                    x.shape[-1], eps)
        return y

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """gate_up float32 contiguous [..., 2 I] (I % 8 == 0) -> silu(gate) * up, float32 [..., I]."""
        i = gate_up.shape[-1] // 2
        out = gate_up.new_empty(gate_up.shape[:-1] + (i,))
        self.lib.specdecode_silu_mul(gate_up.data_ptr(), gate_up.numel() // (2 * i), i, out.data_ptr(),
                                     torch.get_num_threads())
        return out

    def layer_scratch(self, layer, rows: int) -> torch.Tensor:
        """Scratch for decoder_layers over ``rows`` activation rows (layer: a kernels.layer.SdLayer)."""
        n = self.lib.specdecode_layer_scratch(ctypes.addressof(layer), rows)
        return torch.empty((n + 63) // 4 + 16)

    def decoder_layers(self, layers: ctypes.Array, kc: ctypes.Array, vc: ctypes.Array, first: int, stop: int,
                       batch, x: torch.Tensor, scratch: torch.Tensor, capture: ctypes.Array | None = None) -> None:
        """decoder_layer for layers first .. stop - 1 in one call: layers, kc, vc are arrays of the
        layers' SdLayer addresses and of their caches' addresses (one entry per layer). capture: None,
        or an array of one float pointer per layer (entry i for layer i; 0 for none) that receives a
        copy of that layer's output, as many floats as x holds."""
        ptr, w = scratch.data_ptr(), ctypes.sizeof(ctypes.c_void_p)
        rc = self.lib.specdecode_decoder_layers(ctypes.addressof(layers) + first * w, ctypes.addressof(kc) + first * w,
                                                ctypes.addressof(vc) + first * w, stop - first,
                                                ctypes.addressof(batch), x.data_ptr(), ptr + (-ptr) % 64,
                                                torch.get_num_threads(),
                                                None if capture is None else ctypes.addressof(capture) + first * w)
        if rc != 0:
            raise MemoryError("native decoder layer: scratch allocation failed")

    def eagle3_layer(self, layer, kc: int, vc: int, batch, x: torch.Tensor, e: torch.Tensor,
                     scratch: torch.Tensor) -> None:
        """An EAGLE-3 head's decoder layer over x (its hidden input, updated in place to the layer's
        output) beside e (the token embeddings), both float32 contiguous [N, hidden] (layer.c); layer: a
        kernels.layer.SdLayer with embed_norm set; kc, vc: its cache's addresses."""
        ptr = scratch.data_ptr()
        rc = self.lib.specdecode_eagle3_layer(ctypes.addressof(layer), ctypes.addressof(batch), kc, vc, x.data_ptr(),
                                              e.data_ptr(), ptr + (-ptr) % 64, torch.get_num_threads())
        if rc != 0:
            raise MemoryError("native EAGLE-3 layer: scratch allocation failed")

    def argmax_rows(self, x: torch.Tensor) -> torch.Tensor:
        """x float32 [R, V] with unit stride along V -> int64 [R]: torch.argmax(x, -1) (first index of
        the maximum; a row's first NaN where it has one)."""
        out = torch.empty(x.shape[0], dtype=torch.long)
        self.lib.specdecode_argmax_rows(x.data_ptr(), x.shape[0], x.shape[1], x.stride(0), out.data_ptr(),
                                        torch.get_num_threads())
        return out

    def sample_rows(self, x: torch.Tensor, u: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """x float32 [N, V] with unit stride along V, u float64 [R] (R = N, or len(rows): int64 row ids of
        x) -> int64 [R]: sampling.sample's token for each row, bit for bit; -1 where a row holds a NaN,
        an infinity or a negative entry (sample.c)."""
        out = torch.empty(len(u), dtype=torch.long)
        self.lib.specdecode_sample_rows(x.data_ptr(), None if rows is None else rows.data_ptr(), len(u), x.shape[1],
                                        x.stride(0), u.data_ptr(), out.data_ptr(), torch.get_num_threads())
        return out

    def release_threads(self) -> None:
        """Frees the calling thread's OpenMP worker pool (threads.c says why): call it on a thread that
        is done with parallel work before another thread takes it over."""
        self.lib.specdecode_release_threads()


def load_native_kernels(extra_flags: tuple[str, ...] = ()) -> NativeKernels:
    """Builds (or finds in the cache) and loads the library; raises RuntimeError or OSError where it
    cannot. extra_flags are appended to the compiler's (tests build the AVX2 body with -mno-avx512f)."""
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise RuntimeError("no C compiler found")
    path = _build(cc, [*_FLAGS, *extra_flags])
    lib = ctypes.CDLL(str(path))
    p, i = ctypes.c_void_p, ctypes.c_int
    lib.specdecode_int4_gemm.argtypes = [p, i, i, i, i, p, p, p, p, p, p, p, i]
    lib.specdecode_int4_gemm.restype = None
    lib.specdecode_int8_gemm.argtypes = [p, i, i, i, p, p, p, p, p, p, p, p, i]
    lib.specdecode_int8_gemm.restype = None
    lib.specdecode_attention.argtypes = [p, p, p, i, i, i, i, i, i, i, p, p, p, i, ctypes.c_float, p, i]
    lib.specdecode_attention.restype = i
    lib.specdecode_rmsnorm.argtypes = [p, p, p, i, i, ctypes.c_float]
    lib.specdecode_rmsnorm.restype = None
    lib.specdecode_silu_mul.argtypes = [p, i, i, p, i]
    lib.specdecode_silu_mul.restype = None
    lib.specdecode_layer_scratch.argtypes = [p, i]
    lib.specdecode_layer_scratch.restype = ctypes.c_size_t
    lib.specdecode_decoder_layers.argtypes = [p, p, p, i, p, p, p, i, p]
    lib.specdecode_decoder_layers.restype = i
    lib.specdecode_eagle3_layer.argtypes = [p, p, p, p, p, p, p, i]
    lib.specdecode_eagle3_layer.restype = i
    lib.specdecode_release_threads.restype = i
    lib.specdecode_argmax_rows.argtypes = [p, i, i, ctypes.c_long, p, i]
    lib.specdecode_argmax_rows.restype = None
    lib.specdecode_sample_rows.argtypes = [p, p, i, i, ctypes.c_long, p, p, i]
    lib.specdecode_sample_rows.restype = None
    lib.specdecode_isa.restype = ctypes.c_char_p
    return NativeKernels(lib, lib.specdecode_isa().decode(), path.name)


@lru_cache(maxsize=1)
def native_kernels() -> NativeKernels | None:
    """The native kernels, or None where they cannot run here (logged once, with the reason)."""
    if os.environ.get("SPECDECODE_NATIVE_KERNELS", "1") == "0":
        return None
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    try:
        # e.g. SPECDECODE_NATIVE_FLAGS=-mno-avx512f: the AVX2 body, as an Intel client CPU runs it (with
        # AVX-VNNI where this CPU has it); "-mno-avx512f -mno-avxvnni": as Zen 3 runs it
        return load_native_kernels(tuple(os.environ.get("SPECDECODE_NATIVE_FLAGS", "").split()))
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        log.warning("native kernels unavailable (%s): quantized layers use PyTorch's kernels", exc)
        return None


def pack_int4(codes: torch.Tensor, group_size: int) -> torch.Tensor:
    """codes uint8 [N, K] in 0..15 (N % 16 == 0) -> uint8 [N, K / 2] in quant_gemm.c's int4 tile layout:
    rows 16 t .. 16 t + 15 of the result hold tile t, so row ranges on 16-row boundaries pack alone."""
    n, k = codes.shape
    c = group_size // 8
    # codes[16 t + l, g gs + 8 j + 4 h + b] -> [t, g, j, l, b, h]; h = 0 low nibble, 1 high nibble.
    v = codes.reshape(n // TILE, TILE, k // group_size, c, 2, 4).permute(0, 2, 3, 1, 5, 4)
    v = v.to(torch.uint8)
    packed = v[..., 0] | (v[..., 1] << 4)
    return packed.reshape(n, k // 2)


def int4_scale_buffers(n: int, groups: int, supers: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Empty (sub uint8 [N / 16, G, 2, 16], sup int16 [N / 16, B, 2, 16]) for quant_gemm.c's int4
    scales of an [N, G groups] weight in B super-blocks."""
    return (torch.zeros(n // TILE, groups, 2, TILE, dtype=torch.uint8),
            torch.zeros(n // TILE, supers, 2, TILE, dtype=torch.int16))


def store_int4_scales(sub: torch.Tensor, sup: torch.Tensor, start: int, d: torch.Tensor, sc: torch.Tensor,
                      dm: torch.Tensor, m: torch.Tensor) -> None:
    """Rows [start, start + n) of quantize_int4_super's (d, sc, dm, m) into their tiles' lanes: sc and
    m (int8 bits) as sub[tile, g, 0 / 1, lane], d and dm as half bits in sup[tile, b, 0 / 1, lane]."""
    rows = torch.arange(start, start + len(sc))
    t, lane = rows // TILE, rows % TILE
    sub[t, :, 0, lane] = sc.to(torch.uint8)
    sub[t, :, 1, lane] = m.to(torch.int8).view(torch.uint8)
    sup[t, :, 0, lane] = d.to(torch.float16).view(torch.int16)
    sup[t, :, 1, lane] = dm.to(torch.float16).view(torch.int16)


def pack_int8(q: torch.Tensor) -> torch.Tensor:
    """q int8 [N, K] (N % 16 == 0, K % 4 == 0) -> uint8 [N, K] in quant_gemm.c's int8 tile layout
    (u = q + 128; rows 16 t .. 16 t + 15 hold tile t)."""
    n, k = q.shape
    u = (q.to(torch.int16) + 128).to(torch.uint8)
    # u[16 t + l, 4 j + b] -> [t, j, l, b]
    return u.reshape(n // TILE, TILE, k // 4, 4).transpose(1, 2).reshape(n, k)


def unpack_int8(packed: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
    """Inverse of pack_int8 -> int8 [N, K], or only the given rows (int64 ids) -> [len(rows), K]."""
    n, k = packed.shape
    tiles = packed.view(n // TILE, k // 4, TILE, 4)
    u = tiles.transpose(1, 2).reshape(n, k) if rows is None else tiles[rows // TILE, :, rows % TILE, :].reshape(-1, k)
    return (u.to(torch.int16) - 128).to(torch.int8)
