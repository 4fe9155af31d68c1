"""The demo's data and config ship inside the package: byte-identical, and found after a wheel install."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kitune.data.bundled import missing_data_message, packaged_demo_config, packaged_fixture
from kitune.data.loaders import load_corpus, load_questions
from kitune.service.workflows.demo import default_demo_config, default_fixture

ROOT = Path(__file__).resolve().parents[2]
SHARED_FIXTURE = ROOT.parent / "shared" / "data" / "fixture"


def test_packaged_fixture_is_the_whole_fixture_and_the_demo_default() -> None:
    fixture = packaged_fixture()
    assert default_fixture() == fixture and fixture.is_relative_to(ROOT / "src" / "kitune")
    names = sorted(p.name for p in fixture.iterdir())
    assert names == [
        "corpus.jsonl",
        "ground_truth.jsonl",
        "qrel_evidence.txt",
        "qrel_golds.txt",
        "queries.tsv",
    ]
    assert len(load_questions(fixture)) == 24
    assert len(load_corpus(fixture)) == 144
    assert sum(p.stat().st_size for p in fixture.iterdir()) == 88340  # 104 KB on disk


@pytest.mark.skipif(not SHARED_FIXTURE.is_dir(), reason="no ../shared/data/fixture beside this checkout")
def test_packaged_fixture_is_byte_identical_to_the_shared_fixture() -> None:
    shared = {p.name: p.read_bytes() for p in SHARED_FIXTURE.iterdir() if p.is_file()}
    packaged = {p.name: p.read_bytes() for p in packaged_fixture().iterdir()}
    assert packaged.keys() == shared.keys()
    for name, data in shared.items():
        assert packaged[name] == data, f"{name} differs from ../shared/data/fixture/{name}"


def test_the_demo_config_is_packaged_and_the_checkout_path_points_at_it() -> None:
    cfg = packaged_demo_config()
    assert default_demo_config() == cfg and cfg.is_file()
    checkout = ROOT / "configs" / "experiments" / "demo.yaml"
    assert checkout.read_bytes() == cfg.read_bytes()
    attribution = (cfg.parent / "ATTRIBUTION.md").read_text(encoding="utf-8")
    for licence in ("MuSiQue", "CC BY 4.0", "HotpotQA", "CC BY-SA 4.0", "2WikiMultihopQA", "Apache-2.0"):
        assert licence in attribution


def test_a_missing_data_folder_says_where_the_data_comes_from(tmp_path: Path) -> None:
    msg = missing_data_message(tmp_path / "shared" / "data" / "dev")
    assert msg.startswith(f"data path {tmp_path}/shared/data/dev does not exist: pass --data DIR;")
    assert "kitune project's shared data folder (../shared/data beside the checkout" in msg
    assert "kitune demo --print-fixture" in msg


@pytest.mark.slow
def test_a_wheel_installed_into_an_empty_folder_runs_the_demo_from_its_own_files(tmp_path: Path) -> None:
    # Build kitune's wheel from this checkout (offline: the venv's setuptools, no build isolation),
    # install it alone into an empty folder, and run it from there: no checkout, no ../shared.
    wheels = tmp_path / "wheels"
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("PYTHONPATH", None)
    # a copy of what the build reads, so no build/ or egg-info of an earlier build is reused
    checkout = tmp_path / "checkout"
    shutil.copytree(
        ROOT / "src", checkout / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
    )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, checkout / name)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            str(checkout),
            "-w",
            str(wheels),
        ],
        check=True,
        env=env,
        timeout=600,
        capture_output=True,
    )
    (wheel,) = wheels.glob("kitune-*.whl")
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
        check=True,
        env=env,
        timeout=600,
        capture_output=True,
    )
    run_env = {**env, "PYTHONPATH": str(target)}
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    help_out = subprocess.run(
        [sys.executable, "-c", "from kitune.cli import main; main()", "demo", "--help"],
        cwd=elsewhere,
        env={**run_env, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert help_out.returncode == 0, help_out.stderr
    assert "the fixture packaged with kitune" in help_out.stdout
    code = (
        "import json, kitune\n"
        "from kitune.config import load_config\n"
        "from kitune.data.loaders import load_questions\n"
        "from kitune.service.workflows.demo import default_demo_config, default_fixture\n"
        "cfg = load_config(default_demo_config())\n"
        "print(json.dumps({'kitune': kitune.__file__, 'config': str(default_demo_config()),\n"
        "  'fixture': str(default_fixture()), 'questions': len(load_questions(default_fixture())),\n"
        "  'corpus_name': cfg.corpus_name}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=elsewhere, env=run_env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    site = str(target.resolve())
    assert got["kitune"].startswith(site), "the import did not use the installed wheel"
    assert got["config"] == f"{site}/kitune/resources/demo.yaml"
    assert got["fixture"] == f"{site}/kitune/resources/fixture"
    assert got["questions"] == 24 and got["corpus_name"] == "fixture"
