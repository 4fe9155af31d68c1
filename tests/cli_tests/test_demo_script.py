"""``scripts/demo.sh``: --help answers before anything is installed; --replay skips the model install."""

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


def _stub_checkout(tmp_path: Path) -> Path:
    """A copy of demo.sh in a checkout whose .venv, pip, kitune and model installer are stubs that log."""
    root = tmp_path / "checkout"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(SCRIPT, root / "scripts" / "demo.sh")
    (root / "scripts" / "install_local_model.sh").write_text('echo install >> "$LOG_FILE"\n')
    bin_dir = root / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    stubs = {
        # `python -c ...` prints the version tag demo.sh builds constraints/py311.txt from; pip does nothing
        "python": '#!/usr/bin/env bash\n[ "$1" = -c ] && echo 311\nexit 0\n',
        "kitune": '#!/usr/bin/env bash\necho "kitune $*" >> "$LOG_FILE"\n',
    }
    for name, body in stubs.items():
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    return root


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize(
    ("args", "installs_model"),
    [
        (["--replay", "rec"], False),
        (["-n", "2", "--replay=rec"], False),
        (["--questions", "2"], True),
        (["--record", "rec"], True),
    ],
)
def test_demo_sh_replay_skips_model_install(tmp_path: Path, args: list[str], installs_model: bool) -> None:
    # A replay answers every LLM call from the recording: no llama-server build, no model download.
    root = _stub_checkout(tmp_path)
    log = tmp_path / "calls.log"
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHON": str(root / ".venv" / "bin" / "python"),
        "LOG_FILE": str(log),
    }
    r = subprocess.run(
        ["bash", str(root / "scripts" / "demo.sh"), *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    expected = ["install"] if installs_model else []
    assert log.read_text().splitlines() == [*expected, "kitune demo " + " ".join(args)]
    skip_line = (
        "scripts/demo.sh: --replay given: skipping the local model install (scripts/install_local_model.sh)"
    )
    assert r.stdout.splitlines() == ([] if installs_model else [skip_line])
