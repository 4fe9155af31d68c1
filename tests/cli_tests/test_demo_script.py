"""``scripts/demo.sh --help`` answers before anything is installed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "demo.sh"


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_demo_sh_help_installs_nothing(tmp_path: Path, flag: str) -> None:
    # A copy in an empty checkout: --help must not create .venv, pip-install or fetch a model.
    root = tmp_path / "checkout"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(SCRIPT, root / "scripts" / "demo.sh")
    r = subprocess.run(
        ["bash", str(root / "scripts" / "demo.sh"), "--questions", "2", flag],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("Usage: scripts/demo.sh") and "--replay DIR" in r.stdout
    assert sorted(p.name for p in root.iterdir()) == ["scripts"]
