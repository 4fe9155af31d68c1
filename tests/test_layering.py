"""Nothing imports upward (STYLE.md 3.1 layer rule), checked by walking module-level imports."""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "kitune"

# lower number = lower layer; a module may import only same-or-lower layers.
LAYERS = {
    "errors": 0, "config": 0, "text": 0, "usage": 0, "chat": 0, "ki": 0, "schema": 0,
    "lm": 1, "localmodel": 1, "recording": 1,
    "programs": 2, "retrieval": 2, "data": 2,
    "evaluation": 3,
    "optimizers": 4,
    "experiments": 5,
    "service": 6,
    "cli": 7, "server": 7, "mcp_server": 7, "__main__": 8,
    "testing": 9,
}


def _area(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "kitune" or len(parts) < 2:
        return None
    return parts[1]


def test_no_upward_imports():
    problems = []
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC.parent).with_suffix("")
        here = _area(".".join(rel.parts)) or "__init__"
        if here not in LAYERS:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:  # module level only: lazy imports inside functions are allowed
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                there = _area(name)
                if there in LAYERS and LAYERS[there] > LAYERS[here]:
                    problems.append(f"{path.relative_to(SRC)} imports {name}")
    assert problems == []


def test_no_package_named_like_a_dependency():
    banned = {"datasets", "mlflow", "elasticsearch", "dspy", "litellm"}
    for root in (SRC, SRC.parents[1] / "tests"):
        for d in root.rglob("*"):
            assert not (d.is_dir() and d.name in banned), d
