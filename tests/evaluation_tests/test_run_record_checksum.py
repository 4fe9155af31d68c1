"""Every eval run record carries the dataset checksum (issue 25)."""

from __future__ import annotations

import json
from pathlib import Path

from eval_fakes import FakeCorpusStore

from kitune.config import KituneConfig
from kitune.data.checksum import dataset_checksum
from kitune.data.loaders import load_corpus
from kitune.service.pipelines.evaluation import run_eval
from kitune.testing.chat import ScriptedChatModel


def test_run_json_and_summary_json_hold_the_dataset_checksum(tmp_path: Path, fixture_dir: Path) -> None:
    answer = json.dumps({"answer": {"explanation": "", "exact_answer": "x", "confidence": 50}})
    res = run_eval(
        KituneConfig(workdir=tmp_path / "w"),
        skill="baseline",
        data_dir=fixture_dir,
        limit=1,
        concurrency=1,
        progress=False,
        use_judge=False,
        chat_model=ScriptedChatModel([answer], usage=(40, 4)),
        corpus_store=FakeCorpusStore(load_corpus(fixture_dir)),
    )
    expected = dataset_checksum(fixture_dir)
    assert len(expected.sha256) == 64
    params = json.loads((res.run_dir / "run.json").read_text(encoding="utf-8"))
    assert params["data_sha256"] == expected.sha256
    assert params["data_files"] == expected.files
    assert (
        json.loads((res.run_dir / "summary.json").read_text(encoding="utf-8"))["data_sha256"]
        == expected.sha256
    )
    assert res.summary.data_sha256 == expected.sha256
