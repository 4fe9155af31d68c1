"""kitune installs as a library: ranges in pyproject.toml, exact pins in constraints/ (issue 24).

* every third-party package imported under ``src/`` (function-level imports too) is declared,
  in the core dependencies or an extra, not merely brought in by another dependency;
* dependencies are ranges: ``==`` only where an exact version is required (listed below);
* ``constraints/py311.txt`` pins every direct dependency at exactly its lower bound (so CI's 3.11
  leg tests the floors), and every pin in both constraint files lies inside pyproject's range
  (so CI's 3.13 leg tests versions a user can get).
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
CONSTRAINTS = {v: ROOT / "constraints" / f"py{v}.txt" for v in ("311", "313")}

EXACT_ALLOWED = {
    "antlr4-python3-runtime": "the generated ES|QL parsers need the runtime they were generated with",
}
"""Requirements that may use ``==``, with the reason."""


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirements() -> list[Requirement]:
    project = PYPROJECT["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    for extra in project["optional-dependencies"].values():
        reqs += [Requirement(r) for r in extra]
    return reqs


def _pins(path: Path) -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"{path.name}: {line!r} is not an exact pin"
            pins[_norm(name)] = Version(version)
    return pins


def _imported_top_level(root: Path) -> dict[str, str]:
    """Top-level module → one ``file:line`` that imports it, for every absolute import."""
    found: dict[str, str] = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                found.setdefault(top, f"{path.relative_to(root.parent.parent)}:{node.lineno}")
    return found


def test_every_imported_third_party_package_is_declared():
    declared = {_norm(r.name) for r in _requirements()}
    dists = packages_distributions()
    missing = []
    for module, where in sorted(_imported_top_level(ROOT / "src" / "kitune").items()):
        if module in sys.stdlib_module_names or module == "kitune":
            continue
        owners = {_norm(d) for d in dists.get(module, [])}
        assert owners, f"{where}: {module} is imported but not installed by the test extras"
        if not owners & declared:
            missing.append(f"{where}: {module} (from {sorted(owners)})")
    assert missing == [], "imported but not declared in pyproject.toml"


def test_the_checker_sees_function_level_imports(tmp_path: Path):
    pkg = tmp_path / "src" / "kitune"
    pkg.mkdir(parents=True)
    (pkg / "m.py").write_text("def f():\n    import json_repair.x\n    from yaml import safe_load\n")
    assert _imported_top_level(pkg) == {"json_repair": "src/kitune/m.py:2", "yaml": "src/kitune/m.py:3"}


def test_dependencies_are_ranges_with_a_tested_lower_bound():
    for req in _requirements():
        ops = {s.operator for s in req.specifier}
        if "==" in ops:
            assert _norm(req.name) in EXACT_ALLOWED, f"{req}: use a range (exact pins go in constraints/)"
            continue
        assert ">=" in ops, f"{req}: needs a lower bound (the version constraints/py311.txt pins)"


def test_py311_constraints_pin_every_direct_dependency_at_its_lower_bound():
    pins = _pins(CONSTRAINTS["311"])
    for req in _requirements():
        floor = [Version(s.version) for s in req.specifier if s.operator in (">=", "==")]
        assert pins.get(_norm(req.name)) == floor[0], f"{req}: py311.txt pins {pins.get(_norm(req.name))}"


@pytest.mark.parametrize("version", sorted(CONSTRAINTS))
def test_every_pin_lies_inside_the_declared_range(version: str):
    pins = _pins(CONSTRAINTS[version])
    assert "kitune" not in pins
    for req in _requirements():
        pin = pins.get(_norm(req.name))
        assert pin is not None, f"constraints/py{version}.txt has no pin for {req.name}"
        inside = req.specifier.contains(pin, prereleases=True)
        assert inside, f"constraints/py{version}.txt: {req.name}=={pin} is not in {req}"


def test_known_breaks_are_excluded():
    reqs = {_norm(r.name): r for r in _requirements()}
    assert not reqs["litellm"].specifier.contains("1.107.0")  # a compromised release
    assert not reqs["dspy"].specifier.contains("3.5.0")  # removes the dspy.LM.forward override KituneLM uses


def test_python_range_matches_the_tested_versions():
    project = PYPROJECT["project"]
    assert project["requires-python"] == ">=3.11"
    assert PYPROJECT["tool"]["ruff"]["target-version"] == "py311"
    tested = {c.split(" :: ")[-1] for c in project["classifiers"] if c.startswith("Programming Language")}
    assert {"3.11", "3.13"} <= tested
