"""How many threads the CPU kernels run on when the user names no number.

Every native parallel loop ends at a barrier, so a step runs at the pace of its slowest thread. The
GEMMs' threads help a slow one with its tiles (kernels/share.h), but a thread still finishes the chunk it
took, and the activations' quantization and SwiGLU split their work evenly. PyTorch's own default
(one thread per physical core; OpenMP keeps it within the affinity mask) then goes wrong in two common
places:
- a hybrid Intel CPU (Alder Lake and later laptops): the efficiency cores take equal shares of those
  loops at a fraction of a performance core's speed, and a memory-bound decode step gains nothing from
  them (llama.cpp leaves them out too);
- a CPU quota (``docker --cpus``, Kubernetes limits), which it does not read: threads beyond the
  quota's CPUs are throttled together in the middle of a step, while a fraction of a CPU left over
  still pays for one more thread (docs/benchmarks.md, round 40).
The useful count here is one thread per physical core the process may run on (its affinity mask),
performance cores only on a hybrid CPU, at most the quota rounded up; an engine given no thread count
caps torch's at it. Linux only; elsewhere, or where the files are missing, it falls back to what it can
read (at worst ``os.cpu_count()``).
"""
from __future__ import annotations

import math
import os
import platform
from pathlib import Path


def parse_cpulist(text: str) -> set[int]:
    """The kernel's CPU list format ("0-3,8,10-11") as a set of CPU numbers."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except (OSError, ValueError):
        return None


def performance_cpus(root: Path) -> set[int] | None:
    """The performance cores' CPUs on a hybrid Intel CPU (the kernel lists each core type as a PMU:
    cpu_core and cpu_atom), else None."""
    core, atom = _read(root / "sys/devices/cpu_core/cpus"), _read(root / "sys/devices/cpu_atom/cpus")
    if core is None or atom is None:
        return None
    return parse_cpulist(core)


def physical_cores(cpus: set[int], root: Path) -> int:
    """How many physical cores ``cpus`` cover (SMT siblings count once), from sysfs topology; CPUs
    whose topology cannot be read count as cores of their own."""
    cores = set()
    for cpu in cpus:
        topo = root / f"sys/devices/system/cpu/cpu{cpu}/topology"
        package, core = _read(topo / "physical_package_id"), _read(topo / "core_id")
        cores.add((package.strip(), core.strip()) if package is not None and core is not None else ("cpu", str(cpu)))
    return len(cores)


def cpu_quota(root: Path) -> float | None:
    """The CPUs this process's cgroup may use per period (cgroup v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``),
    the smallest along its path to the root; None without a limit."""
    groups = _read(root / "proc/self/cgroup")
    if groups is None:
        return None
    limits = []
    for line in groups.splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        _, controllers, path = fields
        if controllers == "":  # v2: one unified hierarchy
            base, files = root / "sys/fs/cgroup", ("cpu.max",)
        elif "cpu" in controllers.split(","):  # v1: the cpu controller's own mount
            mounts = [root / "sys/fs/cgroup" / d for d in ("cpu,cpuacct", "cpu")]
            base = next((m for m in mounts if m.is_dir()), mounts[-1])
            files = ("cpu.cfs_quota_us", "cpu.cfs_period_us")
        else:
            continue
        # inside a container the hierarchy's root is the container's own group: walk up from the path
        # and look at the base too
        parts = [p for p in path.strip().split("/") if p]
        for depth in range(len(parts), -1, -1):
            d = base.joinpath(*parts[:depth])
            texts = [_read(d / f) for f in files]
            if any(t is None for t in texts):
                continue
            if len(files) == 1:
                quota, _, period = texts[0].strip().partition(" ")
            else:
                quota, period = texts[0].strip(), texts[1].strip()
            try:
                if quota not in ("max", "-1") and int(period) > 0:
                    limits.append(int(quota) / int(period))
            except ValueError:  # a format this parser does not know: no limit read
                continue
    return min(limits) if limits else None


def allowed_cpus() -> set[int]:
    """The CPUs this process may run on: its affinity mask, or every CPU where there is none to read."""
    try:
        allowed = os.sched_getaffinity(0)
    except (AttributeError, OSError):  # not Linux
        allowed = set()
    return set(allowed) or set(range(os.cpu_count() or 1))


def useful_threads(root: str | Path = "/", allowed: set[int] | None = None) -> int:
    """One thread per physical core this process may run on (performance cores only on a hybrid CPU),
    at most its cgroup's CPU quota rounded up, at least 1. ``root``: where sysfs and procfs are found;
    ``allowed``: the CPUs it may run on (None: its affinity mask). Tests give a fake tree and mask."""
    root = Path(root)
    allowed = set(allowed) if allowed else allowed_cpus()
    perf = performance_cpus(root)
    if perf and allowed & perf:
        allowed &= perf
    threads = physical_cores(allowed, root)
    quota = cpu_quota(root)
    if quota is not None:
        threads = min(threads, max(1, math.ceil(quota - 1e-9)))  # a whole quota's float ratio may land a hair above
    return max(1, threads)


def threads_to_set(requested: int | None, current: int, env=os.environ) -> int | None:
    """The thread count an engine sets, or None to leave torch's as it is: the one requested; else
    torch's current count capped at useful_threads() (a caller who lowered it keeps it; PyTorch's own
    default, one thread per physical core of the machine, is cut to the useful ones); no cap where
    OMP_NUM_THREADS or MKL_NUM_THREADS is set, as PyTorch and OpenMP users expect them to decide."""
    if requested:
        return requested
    if any(env.get(v) for v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")):
        return None
    useful = useful_threads()
    return useful if current > useful else None


def cpu_name(cpuinfo: str | Path = "/proc/cpuinfo") -> str:
    """The CPU's model name with its family and model numbers where /proc/cpuinfo gives them (a VM's
    model name can be as bare as "Intel(R) Xeon(R) Processor"), else platform.processor()."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return platform.processor() or platform.machine()
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            if fields:
                break  # the first processor's block is enough
            continue
        fields.setdefault(key.strip(), value.strip())
    name = fields.get("model name") or platform.processor() or platform.machine()
    if "cpu family" in fields and "model" in fields:
        name += f" (family {fields['cpu family']} model {fields['model']})"
    return name
