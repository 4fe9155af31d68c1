"""The layer rule (STYLE.md 3.1, AGENTS.md) is enforced on every import the code can make.

:func:`import_edges` walks the whole syntax tree (``ast.walk``), so it sees module-level,
function-level and ``if TYPE_CHECKING:`` imports alike (a type-only import is still a dependency:
the protocol it names belongs at the layer of its users), and every *string* import: any string
constant that names a kitune module (the lazy ``_EXPORTS`` maps of the packages' ``__init__``
(:mod:`kitune.lazy`) and any other lazy map, ``importlib.import_module("kitune.x")``, a
registry's built-in ``modules=``, ``python -m`` targets), and a registry's ``packages=``, which
stands for every module of that package (:class:`kitune.plugins.Registry` imports them all).
Logger names (``getLogger("kitune.x")``) are not imports. Three rules:

* every module under ``src/kitune`` sits in a layer of :data:`LAYERS` (a new top-level module or
  package must be placed there, and in AGENTS.md);
* nothing imports a higher layer (:data:`LAYERS`, lower number = lower layer; the four tiers of
  ``service/`` are layers of their own, serving → pipelines → tuning → workflows upward);
* no import cycle between modules, string imports included (:func:`find_cycle`, a depth-first
  search over module edges).

Violations that exist today and are being removed are listed in :data:`KNOWN_UPWARD` and
:data:`KNOWN_CYCLE_EDGES`, each with the fix; the tests fail on any other violation and on a
listed one that is gone or no longer needed, so the lists can only shrink.

The checker is tested on planted violations (tests of the test) so a broken walker cannot pass.
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Collection, Iterable
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
    "plugins": 0,
    "lazy": 0,
    "lm": 1,
    "localmodel": 1,
    "recording": 1,
    "programs": 2,
    "retrieval": 2,
    "data": 2,
    "evaluation": 3,
    "optimizers": 4,
    "tracking": 5,
    # service/ is four tiers, each importing only the tiers below it (AGENTS.md); the package's
    # own __init__ (its curated lazy exports) sits above them all.
    "service.serving": 6,
    "service.pipelines": 7,
    "service.tuning": 8,
    "service.workflows": 9,
    "service": 10,
    "cli": 11,
    "server": 11,
    "mcp_server": 11,
    "__main__": 12,
    "testing": 13,
}

SERVICE_TIERS = tuple(a.split(".", 1)[1] for a in LAYERS if a.startswith("service."))


def _area(module: str) -> str | None:
    """The layer a module belongs to: ``service.<tier>`` inside a service tier, else its top package."""
    parts = module.split(".")
    if parts[0] != "kitune" or len(parts) < 2:
        return None
    tier = ".".join(parts[1:3])
    return tier if tier in LAYERS else parts[1]


def _module_name(path: Path, root: Path) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _string_targets(tree: ast.AST, modules: Collection[str]) -> list[tuple[str, int]]:
    """Kitune modules a file names in strings: ``(module, line)`` (see the module docstring).

    A string equal to a module name is an import of it; inside a ``packages=`` keyword it is an
    import of every module of that package; inside a ``getLogger(...)`` call it is a logger name.
    """
    skip: set[int] = set()
    package_args: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name == "getLogger":
                skip.update(id(a) for a in ast.walk(node))
            for kw in node.keywords:
                if kw.arg == "packages":
                    package_args.update(id(a) for a in ast.walk(kw.value))
    out: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)) or id(node) in skip:
            continue
        text, line = node.value, getattr(node, "lineno", 0)
        if id(node) in package_args:
            out += [(m, line) for m in sorted(modules) if m.startswith(text + ".")]
        elif text in modules:
            out.append((text, line))
    return out


def all_modules(root: Path) -> set[str]:
    """Every module and package under ``root`` (``kitune``, ``kitune.cli``, ``kitune.cli.app`` …)."""
    return {_module_name(p, root) for p in root.rglob("*.py")}


def import_edges(root: Path) -> list[tuple[str, str, int]]:
    """(importing module, imported kitune module, line) for every import under ``root``.

    Module-level, function-level and ``TYPE_CHECKING`` imports all count, and so do the string
    imports of :func:`_string_targets` (lazy maps, ``importlib``, registries).
    """
    modules = all_modules(root)
    edges: list[tuple[str, str, int]] = []
    for path in root.rglob("*.py"):
        here = _module_name(path, root)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for target, line in _string_targets(tree, modules):
            if target != here:
                edges.append((here, target, line))
        for node in ast.walk(tree):
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
                    edges.append((here, t, getattr(node, "lineno", 0)))
    return edges


def modules_outside_the_map(root: Path) -> list[str]:
    """Modules whose layer :data:`LAYERS` does not name (the root package ``kitune`` excepted)."""
    return sorted(m for m in all_modules(root) if m != "kitune" and _area(m) not in LAYERS)


def upward_imports(edges: Iterable[tuple[str, str, int]]) -> list[str]:
    """Edges from a lower layer to a higher one, as readable lines."""
    problems = []
    for src, dst, line in edges:
        a, b = _area(src), _area(dst)
        if a in LAYERS and b in LAYERS and LAYERS[b] > LAYERS[a]:
            problems.append(f"{src}:{line} imports {dst} (layer {b} above {a})")
    return sorted(set(problems))


def _graph(
    edges: Iterable[tuple[str, str, int]], drop: Collection[tuple[str, str]] = ()
) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for src, dst, _ in edges:
        if src == "kitune" or dst == "kitune":  # the package's own re-exports are not a dependency
            continue
        if dst.startswith(src + ".") or src.startswith(dst + "."):  # a package and its own modules
            continue
        if (src, dst) in drop:
            continue
        graph.setdefault(src, set()).add(dst)
    return graph


def find_cycle(
    edges: Iterable[tuple[str, str, int]], drop: Collection[tuple[str, str]] = ()
) -> list[str] | None:
    """One import cycle between modules (a list of module names, first == last), or None.

    ``drop`` lists (importer, imported) edges to leave out (the known ones being removed).
    """
    graph = _graph(edges, drop)
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


def layer_problems(
    edges: list[tuple[str, str, int]],
    known_upward: Collection[tuple[str, str]] = (),
    known_cycle_edges: Collection[tuple[str, str]] = (),
) -> list[str]:
    """Every layer-rule violation not in the known lists, plus every known entry that is stale.

    A known upward import is stale when the tree no longer has it; a known cycle edge is stale
    when the tree no longer has it or when it closes no cycle with the other known edges left
    out (the list is minimal: each entry is needed to pass).
    """
    present = {(src, dst) for src, dst, _ in edges}
    problems = [
        p
        for p in upward_imports(edges)
        if (p.split(":", 1)[0], p.split(" imports ", 1)[1].split(" ", 1)[0]) not in known_upward
    ]
    problems += [
        f"stale KNOWN_UPWARD entry (no such import): {k}" for k in sorted(known_upward) if k not in present
    ]
    cycle = find_cycle(edges, known_cycle_edges)
    if cycle:
        problems.append("import cycle: " + " -> ".join(cycle))
    for k in sorted(known_cycle_edges):
        if k not in present:
            problems.append(f"stale KNOWN_CYCLE_EDGES entry (no such import): {k}")
        elif find_cycle(edges, set(known_cycle_edges) - {k}) is None:
            problems.append(f"stale KNOWN_CYCLE_EDGES entry (closes no cycle): {k}")
    return problems


# Violations tolerated while they are being removed, each with its fix beside it. Both are empty
# since issue 24 item 2 was finished; an entry that is gone or not needed fails the test.
KNOWN_UPWARD: set[tuple[str, str]] = set()
KNOWN_CYCLE_EDGES: set[tuple[str, str]] = set()


def test_the_tree_follows_the_layer_rule_every_import_counted():
    assert layer_problems(import_edges(SRC), KNOWN_UPWARD, KNOWN_CYCLE_EDGES) == []


def test_every_module_sits_in_a_layer():
    assert modules_outside_the_map(SRC) == [], "add the module's package to LAYERS and to AGENTS.md"


def test_the_checker_fails_on_a_module_outside_the_map(tmp_path: Path):
    root = _plant(tmp_path, {"config.py": "", "widgets/gadget.py": "", "helpers.py": ""})
    assert modules_outside_the_map(root) == ["kitune.helpers", "kitune.widgets", "kitune.widgets.gadget"]


def test_the_checker_sees_string_imports_importlib_registries_and_lazy_maps(tmp_path: Path):
    root = _plant(
        tmp_path,
        {
            # an upward import through importlib, and one through a lazy map of another name
            "programs/loader.py": "import importlib\n\ndef f():\n"
            "    return importlib.import_module('kitune.optimizers.loop')\n",
            "data/__init__.py": '_COMMANDS = {"run": "kitune.service.optimize"}\n',
            "optimizers/loop.py": "",
            "service/optimize.py": "",
            # a registry whose built-ins import it back: a cycle through a registry string
            "optimizers/registry.py": "from kitune.plugins import Registry\n"
            'R = Registry("x", packages=("kitune.optimizers.builtins",))\n',
            "optimizers/builtins/one.py": "from kitune.optimizers.registry import R\n",
            "plugins.py": "",
            # a logger name is not an import
            "ki.py": 'import logging\nlog = logging.getLogger("kitune.service.optimize")\n',
        },
    )
    assert layer_problems(import_edges(root)) == [
        "kitune.data:1 imports kitune.service.optimize (layer service above data)",
        "kitune.programs.loader:4 imports kitune.optimizers.loop (layer optimizers above programs)",
        "import cycle: kitune.optimizers.builtins.one -> kitune.optimizers.registry"
        " -> kitune.optimizers.builtins.one",
    ]


def _plant(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "kitune"
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    for d in [root, *[p for p in root.rglob("*") if p.is_dir()]]:
        (d / "__init__.py").touch()
    return root


def test_the_checker_catches_planted_upward_imports_type_checking_ones_too(tmp_path: Path):
    root = _plant(
        tmp_path,
        {
            "programs/extractor.py": "def f():\n    from kitune.service.optimize import run\n",
            "service/optimize.py": "def run():\n    pass\n",
            "evaluation/agent.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from kitune.tracking.trackers import Tracker\n",
            "optimizers/__init__.py": '_EXPORTS: dict[str, str] = {"run": "kitune.service.optimize"}\n',
        },
    )
    assert layer_problems(import_edges(root)) == [
        "kitune.evaluation.agent:3 imports kitune.tracking.trackers (layer tracking above evaluation)",
        "kitune.optimizers:1 imports kitune.service.optimize (layer service above optimizers)",
        "kitune.programs.extractor:2 imports kitune.service.optimize (layer service above programs)",
    ]
    # a known entry silences only its own edge, and one that is not in the tree fails
    known = {("kitune.programs.extractor", "kitune.service.optimize"), ("kitune.data.x", "kitune.cli.y")}
    assert layer_problems(import_edges(root), known) == [
        "kitune.evaluation.agent:3 imports kitune.tracking.trackers (layer tracking above evaluation)",
        "kitune.optimizers:1 imports kitune.service.optimize (layer service above optimizers)",
        "stale KNOWN_UPWARD entry (no such import): ('kitune.data.x', 'kitune.cli.y')",
    ]


def test_the_checker_catches_a_planted_cycle_through_type_checking_and_function_imports(tmp_path: Path):
    root = _plant(
        tmp_path,
        {
            "service/drift.py": "def f():\n    from kitune.service.optimize import g\n",
            "service/optimize.py": "def g():\n    from kitune.service.improve import h\n",
            "service/improve.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from kitune.service.drift import f\n",
            "service/ok.py": "from kitune.service.drift import f\n",
        },
    )
    edges = import_edges(root)
    cycle = find_cycle(edges)
    assert cycle is not None and cycle[0] == cycle[-1]
    assert set(cycle) == {"kitune.service.drift", "kitune.service.optimize", "kitune.service.improve"}
    assert layer_problems(edges) == [
        "import cycle: kitune.service.drift -> kitune.service.optimize -> kitune.service.improve"
        " -> kitune.service.drift"
    ]
    # one known edge breaks it; a second known edge of the same cycle is not needed and fails
    assert layer_problems(edges, known_cycle_edges={("kitune.service.improve", "kitune.service.drift")}) == []
    both = {
        ("kitune.service.improve", "kitune.service.drift"),
        ("kitune.service.drift", "kitune.service.optimize"),
    }
    stale = "stale KNOWN_CYCLE_EDGES entry (closes no cycle): "
    assert layer_problems(edges, known_cycle_edges=both) == [
        stale + "('kitune.service.drift', 'kitune.service.optimize')",
        stale + "('kitune.service.improve', 'kitune.service.drift')",
    ]
    gone = {("kitune.service.ok", "kitune.service.improve")}
    assert layer_problems(edges, known_cycle_edges=gone)[-1] == (
        "stale KNOWN_CYCLE_EDGES entry (no such import): ('kitune.service.ok', 'kitune.service.improve')"
    )
    # a package importing its own modules is no cycle
    assert (
        find_cycle(import_edges(_plant(tmp_path / "b", {"a/x.py": "import kitune.a.y\n", "a/y.py": ""})))
        is None
    )


def test_the_checker_orders_the_service_tiers(tmp_path: Path):
    root = _plant(
        tmp_path,
        {
            "service/serving/context.py": "from kitune.service.tuning.optimize import run\n",
            "service/tuning/optimize.py": "from kitune.service.serving.context import get\n"
            "from kitune.service.workflows.demo import d\n",
            "service/workflows/demo.py": "from kitune.service.tuning import optimize\n",
            "cli/cmds.py": "from kitune.service.workflows.demo import d\n",
        },
    )
    assert layer_problems(import_edges(root)) == [
        "kitune.service.serving.context:1 imports kitune.service.tuning.optimize"
        " (layer service.tuning above service.serving)",
        "kitune.service.tuning.optimize:2 imports kitune.service.workflows.demo"
        " (layer service.workflows above service.tuning)",
        "import cycle: kitune.service.tuning.optimize -> kitune.service.serving.context"
        " -> kitune.service.tuning.optimize",
    ]


def test_every_service_module_sits_in_a_tier():
    service = SRC / "service"
    rel = [p.relative_to(service) for p in service.rglob("*.py")]
    in_tier = [r for r in rel if len(r.parts) > 1 and r.parts[0] in SERVICE_TIERS]
    loose = [str(r) for r in rel if r != Path("__init__.py") and r not in in_tier]
    assert loose == [], "put each service module in one tier: " + ", ".join(SERVICE_TIERS)


def test_no_package_named_like_a_dependency():
    banned = {"datasets", "mlflow", "elasticsearch", "dspy", "litellm"}
    for root in (SRC, SRC.parents[1] / "tests"):
        for d in root.rglob("*"):
            assert not (d.is_dir() and d.name in banned), d


def _function_level_imports(path: Path, exempt: Collection[str]) -> list[str]:
    """``line:module`` of each import inside a function or class, heavy (exempt) modules left out."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    scopes = [
        n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    ]
    found = []
    for scope in scopes:
        for node in ast.walk(scope):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            found += [f"{node.lineno}:{n}" for n in names if n.split(".")[0] not in exempt]
    return sorted(set(found), key=lambda s: int(s.split(":")[0]))


def test_the_import_outside_top_level_to_do_list_only_shrinks():
    """pyproject's PLC0415 per-file ignores under src/ (outside cli/) name files that still need them."""
    ruff = tomllib.loads((SRC.parents[1] / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["ruff"][
        "lint"
    ]
    exempt = set(ruff["flake8-tidy-imports"]["banned-module-level-imports"])
    todo = [f for f, rules in ruff["per-file-ignores"].items() if f.startswith("src/") and "PLC0415" in rules]
    assert "src/kitune/cli/*.py" in todo  # the commands' deliberate deferral (see pyproject)
    stale = [f for f in todo if "*" not in f and not _function_level_imports(SRC.parents[1] / f, exempt)]
    assert stale == [], "these files import everything at the top now: drop their PLC0415 ignore"


def test_the_to_do_check_sees_function_level_imports_and_exempts_heavy_ones(tmp_path: Path):
    path = tmp_path / "m.py"
    path.write_text(
        "import os\nclass C:\n    def f(self):\n        import mlflow.tracking\n"
        "        from kitune.schema import Filter\n        return os\n",
        encoding="utf-8",
    )
    assert _function_level_imports(path, {"mlflow"}) == ["5:kitune.schema"]
    assert _function_level_imports(path, {"mlflow", "kitune"}) == []
