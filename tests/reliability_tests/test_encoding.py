"""Reserve case (microsoft/graphrag #1894, Graphify-Labs/graphify #29): text I/O without an
explicit encoding breaks under non-UTF-8 locales (GBK on Windows). Every text-mode ``open``,
``read_text`` and ``write_text`` in ``src/kitune`` must name its encoding."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "kitune"
_NOT_FILES = {"os", "opener", "urllib", "webbrowser", "backend"}
"""Receivers whose ``.open`` is not a text file open (file descriptors, URL openers, a store backend)."""


def _mode(call: ast.Call, is_method: bool) -> str:
    args = call.args
    node = (args[0] if args else None) if is_method else (args[1] if len(args) > 1 else None)
    for kw in call.keywords:
        if kw.arg == "mode":
            node = kw.value
    if node is None:
        return "r"
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else "?"


def text_io_without_encoding(root: Path) -> list[str]:
    """``path:line call`` for each text-mode file call in ``root`` that does not pass ``encoding``."""
    bad: list[str] = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call) or any(kw.arg == "encoding" for kw in node.keywords):
                continue
            func = node.func
            if isinstance(func, ast.Attribute):
                receiver = func.value.id if isinstance(func.value, ast.Name) else ""
                name, is_method = func.attr, True
            elif isinstance(func, ast.Name):
                receiver, name, is_method = "", func.id, False
            else:
                continue
            if name in ("read_text", "write_text"):
                bad.append(f"{path.relative_to(root)}:{node.lineno} {name}")
            elif name == "open" and receiver not in _NOT_FILES:
                mode = _mode(node, is_method)
                if "b" not in mode:
                    bad.append(f"{path.relative_to(root)}:{node.lineno} open({mode!r})")
    return bad


def test_every_text_file_call_names_its_encoding() -> None:
    assert text_io_without_encoding(SRC) == []


def test_the_scan_finds_a_missing_encoding(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(
        "from pathlib import Path\n"
        "Path('a').read_text()\n"
        "open('b')\n"
        "open('c', 'rb')\n"
        "Path('d').open('w', encoding='utf-8')\n"
        "Path('e').open('a')\n",
        encoding="utf-8",
    )
    assert text_io_without_encoding(tmp_path) == ["m.py:2 read_text", "m.py:3 open('r')", "m.py:6 open('a')"]
