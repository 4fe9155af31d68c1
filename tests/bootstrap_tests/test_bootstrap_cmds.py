"""``kitune bootstrap`` and ``kitune extract --prompt-alias`` through the CLI, with stand-ins."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import pytest
import typer
from typer.testing import CliRunner

from kitune.cli import bootstrap_cmds, extract_cmds
from kitune.retrieval.embedders import HashEmbedder
from kitune.retrieval.memory import MemoryStore
from kitune.testing.lm import mock_usage_lm
from kitune.tracking.prompts import PromptRegistry

REPLY = {
    "domain": "Films, rivers and chemists",
    "entity_types": ["film", "river"],
    "predicates": ["directed_by"],
}


@pytest.fixture
def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    import kitune.lm as lm_mod
    import kitune.retrieval as retrieval

    monkeypatch.setenv("COLUMNS", "250")  # no line wrapping in the captured output
    config = tmp_path / "kitune.yaml"
    config.write_text(f"workdir: {tmp_path / 'work'}\ncorpus_name: toy\nembedder:\n  type: hash\n  dim: 64\n")
    store = MemoryStore(embedder=HashEmbedder(dim=64))
    monkeypatch.setattr(retrieval, "create_store", lambda cfg, embedder=None: store)
    monkeypatch.setattr(
        lm_mod, "build_lm", lambda cfg, role, ledger=None: mock_usage_lm(json.dumps(REPLY), ledger=ledger)
    )
    app = typer.Typer()
    bootstrap_cmds.register(app)
    extract_cmds.register(app)
    return {"app": app, "config": config, "store": store, "work": tmp_path / "work"}


def test_bootstrap_command_end_to_end(setup: dict[str, Any], prose_corpus: Path) -> None:
    args = [
        "bootstrap",
        "--corpus",
        str(prose_corpus),
        "-c",
        str(setup["config"]),
        "--seed",
        "1",
        "--sample-size",
        "4",
        "--pin-types",
        "award,person",
        "--pin-types",
        "prize",
        "--no-track",
    ]
    r = CliRunner().invoke(setup["app"], args)
    assert r.exit_code == 0, r.output
    assert "domain: Films, rivers and chemists (ok)" in r.output
    assert "entity types: award, person, prize, film, river" in r.output
    assert "pinned types restored: award, person, prize" in r.output
    assert "kitune-toy-extractor v1 (candidate, production)" in r.output
    assert "source-description KIs written: 2/2" in r.output
    assert "tokens extract/bootstrap:describe: 1 call(s), 10 in, 20 out" in r.output
    report = json.loads((setup["work"] / "bootstrap" / "toy" / "report.json").read_text())
    assert report["seed"] == 1 and len(report["sample"]) == 4
    again = CliRunner().invoke(setup["app"], args)
    assert (
        again.exit_code == 0 and "v1 (candidate, production) (same text already registered)" in again.output
    )
    assert (
        json.loads((setup["work"] / "bootstrap" / "toy" / "report.json").read_text())["sample"]
        == report["sample"]
    )


def test_bootstrap_reports_a_missing_corpus(setup: dict[str, Any], tmp_path: Path) -> None:
    r = CliRunner().invoke(
        setup["app"], ["bootstrap", "--corpus", str(tmp_path / "none.jsonl"), "-c", str(setup["config"])]
    )
    assert r.exit_code == 2 and "does not exist" in r.output


def test_fallback_description_exits_1(
    setup: dict[str, Any], prose_corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import kitune.lm as lm_mod

    monkeypatch.setattr(
        lm_mod, "build_lm", lambda cfg, role, ledger=None: mock_usage_lm("no idea", ledger=ledger)
    )
    r = CliRunner().invoke(
        setup["app"],
        [
            "bootstrap",
            "--corpus",
            str(prose_corpus),
            "-c",
            str(setup["config"]),
            "--no-track",
            "--no-register",
        ],
    )
    assert r.exit_code == 1, r.output
    assert "(fallback)" in r.output and "description" in r.output


def test_extract_uses_the_registered_production_prompt(
    setup: dict[str, Any], prose_corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import kitune.service.pipelines.extraction as extraction

    seen: dict[str, str] = {}

    class _Report:
        failed: ClassVar[dict[str, str]] = {}

        def summary_rows(self) -> list[tuple[str, str]]:
            return [("documents", "30")]

    def fake_extract_corpus(docs: Any, store: Any, extractor: Any, **kw: Any) -> _Report:
        seen["instruction"] = extractor.extract.signature.instructions
        return _Report()

    monkeypatch.setattr(extraction, "extract_corpus", fake_extract_corpus)
    cfg_args = ["-c", str(setup["config"])]
    missing = CliRunner().invoke(
        setup["app"], ["extract", "--data", str(prose_corpus), *cfg_args, "--prompt-alias", "production"]
    )
    assert missing.exit_code == 2 and "no prompt named 'kitune-toy-extractor'" in missing.output
    boot = CliRunner().invoke(
        setup["app"], ["bootstrap", "--corpus", str(prose_corpus), *cfg_args, "--no-track"]
    )
    assert boot.exit_code == 0, boot.output
    r = CliRunner().invoke(
        setup["app"],
        ["extract", "--data", str(prose_corpus), *cfg_args, "--prompt-alias", "production", "--no-progress"],
    )
    assert r.exit_code == 0, r.output
    assert "extractor prompt: kitune-toy-extractor v1 (production)" in r.output
    registered = PromptRegistry(f"sqlite:///{setup['work'] / 'mlflow.db'}").get(
        "kitune-toy-extractor", "production"
    )
    assert seen["instruction"] == registered.text and "Domain focus (toy)" in seen["instruction"]
    both = CliRunner().invoke(
        setup["app"],
        [
            "extract",
            "--data",
            str(prose_corpus),
            *cfg_args,
            "--prompt-alias",
            "production",
            "--instructions",
            str(setup["config"]),
        ],
    )
    assert both.exit_code == 2 and "give one of them" in " ".join(both.output.split())
