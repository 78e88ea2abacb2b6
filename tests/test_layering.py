"""The package imports downward only, and no two files import each other (directly or round a cycle).

Every ``import`` counts, including those inside functions and ``TYPE_CHECKING`` blocks: a lazy import
is still a dependency. The layers, bottom to top, are in LAYERS; docs/architecture.md draws them."""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "specdecode"

# Each unit (a top-level module or package of specdecode) may import units of lower layers only.
LAYERS = [
    {"errors"},
    {"config", "sampling_params"},
    {"kernels"},
    {"sampling", "store", "tokenizer", "runtime", "args"},
    {"layers", "heads"},
    {"models"},
    {"loader"},
    {"speculative"},
    {"engine"},
    {"llm"},
    {"server", "train"},
    {"bench"},
    {"cli"},
    {""},  # specdecode/__init__.py: the public facade
]
RANK = {unit: i for i, units in enumerate(LAYERS) for unit in units}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """module -> the specdecode modules it imports (``from pkg import mod`` counts as importing mod)."""
    modules = {_module_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[:len(package.split(".")) - node.level + 1]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                targets = [mod] + [f"{mod}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            for t in targets:
                if t in modules and t != name:
                    graph[name].add(t)
    for name in modules:
        graph.setdefault(name, set())
    return graph


def unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_every_unit_has_a_layer():
    assert {unit(m) for m in import_graph()} <= set(RANK), set(unit(m) for m in import_graph()) - set(RANK)


def test_units_import_downward_only():
    upward = sorted(f"{a} -> {b}" for a, bs in import_graph().items() for b in bs
                    if unit(a) != unit(b) and RANK[unit(b)] >= RANK[unit(a)])
    assert not upward, "imports that do not go down a layer:\n" + "\n".join(upward)


def test_the_engine_core_never_imports_its_surfaces():
    low = {"runtime", "layers", "models", "loader", "speculative", "engine", "llm"}
    surfaces = {"server", "cli", "args", "bench", "train"}
    bad = sorted(f"{a} -> {b}" for a, bs in import_graph().items() for b in bs
                 if unit(a) in low and unit(b) in surfaces)
    assert not bad, bad


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_file_cycles():
    graph = import_graph()
    # A package's __init__ may re-export its own modules: that edge is the package, not a cycle.
    graph = {a: {b for b in bs if not (b.startswith(a + ".") and unit(a) == unit(b))} for a, bs in graph.items()}
    assert not _cycles(graph), _cycles(graph)


def test_no_package_cycles():
    pk: dict[str, set[str]] = defaultdict(set)
    for a, bs in import_graph().items():
        pa = a.rpartition(".")[0] if not (ROOT.parent / a.replace(".", "/")).is_dir() else a
        for b in bs:
            pb = b.rpartition(".")[0] if not (ROOT.parent / b.replace(".", "/")).is_dir() else b
            if pa != pb and not pb.startswith(pa + ".") and not pa.startswith(pb + "."):
                pk[pa].add(pb)
    for v in list(pk):
        for w in pk[v]:
            pk.setdefault(w, set())
    assert not _cycles(pk), _cycles(pk)


def test_the_checker_sees_a_cycle_and_an_upward_import():
    """The checks above would fail on a broken tree: a two-file cycle and an upward import."""
    assert _cycles({"a": {"b"}, "b": {"a"}}) == [["a", "b"]]
    assert RANK["runtime"] < RANK["speculative"] < RANK["engine"] < RANK["server"] < RANK["cli"]
