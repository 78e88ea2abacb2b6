"""What a benchmark ran on, written beside its figures: a tok/s means something only next to the CPU, the
kernels' instruction set and the threads that produced it, and figures from two machines (or two
thread counts) must not be compared as if they were one run."""
from __future__ import annotations

import platform
import subprocess
from importlib import metadata
from pathlib import Path

import torch

from ..kernels import native_kernels
from ..runtime.cpus import allowed_cpus, cpu_name, cpu_quota, threads_to_set


def revision() -> str:
    """specdecode's version, and the commit of the checkout it runs from where it is one (with "+" when
    the tree has changes)."""
    try:
        version = metadata.version("specdecode")
    except metadata.PackageNotFoundError:
        version = "unknown"
    root = Path(__file__).resolve().parents[2]  # the checkout, where the package runs from one

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=5)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip() if out.returncode == 0 else None
    top = git("rev-parse", "--show-toplevel")  # not some other repository that holds an installed copy
    rev = git("describe", "--always", "--dirty=+") if top and Path(top).resolve() == root else None
    return f"{version} ({rev})" if rev else version


def host_info(threads: int | None) -> dict:
    """The machine and settings of a run whose engines get ``threads`` (EngineConfig.threads: None
    for the engine's default, resolved here as the engine resolves it)."""
    native = native_kernels()
    return {"cpu": cpu_name(), "cpus_usable": len(allowed_cpus()), "cpu_quota": cpu_quota(Path("/")),
            "threads": threads_to_set(threads, torch.get_num_threads()) or torch.get_num_threads(),
            "kernels": native.isa if native else None, "torch": torch.__version__, "specdecode": revision(),
            "python": platform.python_version(), "platform": platform.platform()}


def host_line(info: dict) -> str:
    """One line for the terminal."""
    return (f"{info['cpu']}, {info['threads']} thread{'s' if info['threads'] != 1 else ''}, "
            f"kernels {info['kernels'] or 'none (PyTorch)'}, torch {info['torch']}")
