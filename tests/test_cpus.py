"""The thread count an engine uses when given none (runtime/cpus.py), over fake sysfs / procfs trees."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from specdecode.runtime.cpus import (cpu_name, cpu_quota, parse_cpulist, physical_cores, threads_to_set,
                                     useful_threads)


def write(root: Path, rel: str, text: str) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def topology(root: Path, cores: dict[int, int], package: int = 0) -> None:
    """cpu -> core id, all in one package."""
    for cpu, core in cores.items():
        write(root, f"sys/devices/system/cpu/cpu{cpu}/topology/core_id", f"{core}\n")
        write(root, f"sys/devices/system/cpu/cpu{cpu}/topology/physical_package_id", f"{package}\n")


def test_parse_cpulist():
    assert parse_cpulist("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert parse_cpulist("5") == {5}
    assert parse_cpulist("") == set()


def test_smt_siblings_count_once(tmp_path):
    topology(tmp_path, {c: c % 4 for c in range(8)})  # 4 cores, 2 threads each: cpu c and c + 4
    assert useful_threads(tmp_path, allowed=set(range(8))) == 4
    assert useful_threads(tmp_path, allowed={0, 4}) == 1  # one core's two threads
    assert useful_threads(tmp_path, allowed={0, 1}) == 2


def test_hybrid_cpu_keeps_performance_cores(tmp_path):
    # 2 performance cores with 2 threads each (cpus 0-3), 4 efficiency cores (cpus 4-7)
    topology(tmp_path, {0: 0, 1: 0, 2: 4, 3: 4, 4: 8, 5: 9, 6: 10, 7: 11})
    write(tmp_path, "sys/devices/cpu_core/cpus", "0-3\n")
    write(tmp_path, "sys/devices/cpu_atom/cpus", "4-7\n")
    assert useful_threads(tmp_path, allowed=set(range(8))) == 2
    assert useful_threads(tmp_path, allowed={4, 5, 6}) == 3  # pinned to efficiency cores: those it has


def test_unreadable_topology_counts_cpus(tmp_path):
    assert physical_cores({0, 1, 2}, tmp_path) == 3
    assert useful_threads(tmp_path, allowed={3, 5}) == 2


@pytest.mark.parametrize("cpu_max, want", [("100000 100000\n", 1), ("150000 100000\n", 2), ("250000 100000\n", 3),
                                           ("max 100000\n", 4), ("50000 100000\n", 1), ("900000 100000\n", 4)])
def test_cgroup_v2_quota(tmp_path, cpu_max, want):
    topology(tmp_path, {c: c for c in range(4)})
    write(tmp_path, "proc/self/cgroup", "0::/system.slice/app.service\n")
    write(tmp_path, "sys/fs/cgroup/system.slice/app.service/cpu.max", cpu_max)
    assert useful_threads(tmp_path, allowed=set(range(4))) == want


def test_cgroup_v2_parent_limit_and_container_view(tmp_path):
    write(tmp_path, "proc/self/cgroup", "0::/kubepods/pod1/c1\n")
    write(tmp_path, "sys/fs/cgroup/kubepods/pod1/c1/cpu.max", "max 100000\n")
    write(tmp_path, "sys/fs/cgroup/kubepods/pod1/cpu.max", "300000 100000\n")
    assert cpu_quota(tmp_path) == 3.0  # the tightest level on the way up
    other = tmp_path / "container"  # inside a cgroup namespace: the path names a group above the mount
    write(other, "proc/self/cgroup", "0::/kubepods/pod1/c1\n")
    write(other, "sys/fs/cgroup/cpu.max", "200000 100000\n")
    assert cpu_quota(other) == 2.0


def test_cgroup_v1_quota(tmp_path):
    write(tmp_path, "proc/self/cgroup", "5:memory:/x\n4:cpu,cpuacct:/docker/abc\n0::/\n")
    write(tmp_path, "sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "200000\n")
    write(tmp_path, "sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000\n")
    assert cpu_quota(tmp_path) == 2.0
    write(tmp_path, "sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "-1\n")
    assert cpu_quota(tmp_path) is None


def test_malformed_cgroup_files_mean_no_limit(tmp_path):
    write(tmp_path, "proc/self/cgroup", "garbage\n0::/a\n")
    write(tmp_path, "sys/fs/cgroup/a/cpu.max", "lots 100000\n")
    assert cpu_quota(tmp_path) is None
    assert cpu_quota(tmp_path / "missing") is None


def test_engine_thread_count_rule(monkeypatch):
    monkeypatch.setattr("specdecode.runtime.cpus.useful_threads", lambda: 4)
    assert threads_to_set(3, 16, env={}) == 3  # asked for: always
    assert threads_to_set(None, 16, env={}) == 4  # torch's machine-wide default: capped
    assert threads_to_set(None, 2, env={}) is None  # a caller's lower setting stays
    assert threads_to_set(None, 16, env={"OMP_NUM_THREADS": "16"}) is None  # the environment decides


def test_engine_caps_torch_threads(monkeypatch):
    """An engine built with no thread count cuts a higher torch setting to the useful count and leaves
    a lower one (conftest's 1) alone; one given a count sets it."""
    from tiny_models import tiny_llm

    before = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    monkeypatch.setattr("specdecode.runtime.cpus.useful_threads", lambda: 1)
    try:
        torch.set_num_threads(2)
        tiny_llm()
        assert torch.get_num_threads() == 1
        monkeypatch.setattr("specdecode.runtime.cpus.useful_threads", lambda: 2)
        tiny_llm()
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)

def test_cpu_name_from_cpuinfo(tmp_path):
    f = tmp_path / "cpuinfo"
    f.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 207\n"
                 "model name\t: Intel(R) Xeon(R) Processor\n\nprocessor\t: 1\nmodel name\t: other\n")
    assert cpu_name(f) == "Intel(R) Xeon(R) Processor (family 6 model 207)"
    f.write_text("processor\t: 0\nmodel name\t: AMD EPYC 9R14\n")
    assert cpu_name(f) == "AMD EPYC 9R14"
    assert cpu_name(tmp_path / "missing")  # some name, never an error


def test_serve_logs_what_it_runs():
    from specdecode.config import EngineConfig, SpecConfig
    from specdecode.server.cli import startup_line

    line = startup_line(["m1", "m2"], EngineConfig(model="m", max_num_seqs=3, spec=SpecConfig(spec_type="ngram")))
    assert line.startswith("serving m1, m2: --spec-type ngram, 3 slots, ")
    assert f"{torch.get_num_threads()} threads, kernels " in line and cpu_name() in line
