"""The layer rule (STYLE.md 3.1, AGENTS.md) is enforced on every import, function-level ones too.

A deferred import is still a dependency, so :func:`import_edges` walks the whole syntax tree
(``ast.walk``), not only module-level statements; ``if TYPE_CHECKING:`` imports are skipped
(they never run). Two rules:

* nothing imports a higher layer (:data:`LAYERS`, lower number = lower layer);
* no import cycle between modules (:func:`find_cycle`, a depth-first search over module edges).

The checker is tested on planted violations (tests of the test) so a broken walker cannot pass.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "kitune"

# lower number = lower layer; a module may import only same-or-lower layers.
LAYERS = {
    "errors": 0,
    "config": 0,
    "text": 0,
    "usage": 0,
    "chat": 0,
    "ki": 0,
    "schema": 0,
    "lm": 1,
    "localmodel": 1,
    "recording": 1,
    "programs": 2,
    "retrieval": 2,
    "data": 2,
    "evaluation": 3,
    "optimizers": 4,
    "experiments": 5,
    "service": 6,
    "cli": 7,
    "server": 7,
    "mcp_server": 7,
    "__main__": 8,
    "testing": 9,
}


def _area(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "kitune" or len(parts) < 2:
        return None
    return parts[1]


def _module_name(path: Path, root: Path) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """ids of import nodes under ``if TYPE_CHECKING:`` (never executed)."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", None)
            if name == "TYPE_CHECKING":
                for sub in node.body:
                    for inner in ast.walk(sub):
                        skip.add(id(inner))
    return skip


def import_edges(root: Path) -> list[tuple[str, str, int]]:
    """(importing module, imported kitune module, line) for every runtime import under ``root``."""
    modules = {_module_name(p, root) for p in root.rglob("*.py")}
    edges: list[tuple[str, str, int]] = []
    for path in root.rglob("*.py"):
        here = _module_name(path, root)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skip = _type_checking_nodes(tree)
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # `from kitune.x import y` may name a submodule y
                targets = [
                    f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                    for a in node.names
                ]
            for t in targets:
                if t.startswith("kitune") and t != here:
                    edges.append((here, t, node.lineno))
    return edges


def upward_imports(edges: Iterable[tuple[str, str, int]]) -> list[str]:
    """Edges from a lower layer to a higher one, as readable lines."""
    problems = []
    for src, dst, line in edges:
        a, b = _area(src), _area(dst)
        if a in LAYERS and b in LAYERS and LAYERS[b] > LAYERS[a]:
            problems.append(f"{src}:{line} imports {dst} (layer {b} above {a})")
    return sorted(set(problems))


def find_cycle(edges: Iterable[tuple[str, str, int]]) -> list[str] | None:
    """One import cycle between modules (a list of module names, first == last), or None."""
    graph: dict[str, set[str]] = {}
    for src, dst, _ in edges:
        if src == "kitune" or dst == "kitune":  # the package's own re-exports are not a dependency
            continue
        if dst.startswith(src + ".") or src.startswith(dst + "."):  # a package and its own modules
            continue
        graph.setdefault(src, set()).add(dst)
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_no_upward_imports_function_level_included():
    assert upward_imports(import_edges(SRC)) == []


def test_no_import_cycles():
    assert find_cycle(import_edges(SRC)) is None


def _plant(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "kitune"
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    for d in [root, *[p for p in root.rglob("*") if p.is_dir()]]:
        (d / "__init__.py").touch()
    return root


def test_the_checker_catches_a_planted_function_level_upward_import(tmp_path: Path):
    root = _plant(
        tmp_path,
        {
            "programs/extractor.py": "def f():\n    from kitune.service.optimize import run\n    return run\n",  # noqa: E501
            "service/optimize.py": "from kitune.programs.extractor import f\n",
            "evaluation/agent.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from kitune.service.optimize import run\n",
        },
    )
    problems = upward_imports(import_edges(root))
    assert problems == [
        "kitune.programs.extractor:2 imports kitune.service.optimize (layer service above programs)"
    ]


def test_the_checker_catches_a_planted_cycle(tmp_path: Path):
    root = _plant(
        tmp_path,
        {
            "service/drift.py": "def f():\n    from kitune.service.optimize import g\n",
            "service/optimize.py": "def g():\n    from kitune.service.improve import h\n",
            "service/improve.py": "from kitune.service.drift import f\n",
            "service/ok.py": "from kitune.service.drift import f\n",
        },
    )
    cycle = find_cycle(import_edges(root))
    assert cycle is not None and cycle[0] == cycle[-1]
    assert set(cycle) == {"kitune.service.drift", "kitune.service.optimize", "kitune.service.improve"}
    assert (
        find_cycle(import_edges(_plant(tmp_path / "b", {"a/x.py": "import kitune.a.y\n", "a/y.py": ""})))
        is None
    )


def test_no_package_named_like_a_dependency():
    banned = {"datasets", "mlflow", "elasticsearch", "dspy", "litellm"}
    for root in (SRC, SRC.parents[1] / "tests"):
        for d in root.rglob("*"):
            assert not (d.is_dir() and d.name in banned), d
