"""The extraction-variants benchmark end to end against a stub that plays a local llama.cpp server.

The stub answers from the request alone, the way each variant's request differs: with the
output schema it returns facts for the first two sentences, without ``response_format`` for the
first one only, with ``minItems`` or with demonstrations in the prompt for every sentence, and
asked about one numbered sentence, for that sentence. So every variant's figures are known
exactly, and the test fails if a variant does not send what it claims to.
"""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path
from typing import Any

import extraction_variants
import pytest
from extraction_variants import main

from kitune.lm import KituneLM, reset_format_memory
from kitune.programs.sentences import sentence_spans
from kitune.recording import get_recorder, reset_recorders
from kitune.testing.faults import request_text
from kitune.testing.lm import stub_server_lm
from kitune.testing.openai_stub import RecordedRequest, Reply, StubServer

DOCS = {
    "g1": "Alpha Town is in Beta County. It was founded in 1801. Its mayor is Carol King.",
    "g2": "Delta River flows into Echo Lake. The river is 40 km long.",
    "z9": "Zeta Corp makes zips. Zeta Corp was founded in 1990 by Ann Lee.",  # the demonstration
}
QUESTIONS = [
    ("1", "Which county is Alpha Town in?", "Beta County", "g1", True),
    ("2", "Who is the mayor of Alpha Town?", "Carol King", "g1", True),
    ("3", "How long is the river that flows into Echo Lake?", "40 km", "g2", False),  # no gold line
]


def _write_fixture(root: Path) -> Path:
    data = root / "fixture"
    data.mkdir()
    (data / "corpus.jsonl").write_text(
        "".join(json.dumps({"docid": d, "title": d.upper(), "text": t}) + "\n" for d, t in DOCS.items())
    )
    (data / "ground_truth.jsonl").write_text(
        "".join(
            json.dumps({"query_id": q, "query": text, "answer": a}) + "\n" for q, text, a, _, _ in QUESTIONS
        )
    )
    (data / "queries.tsv").write_text("".join(f"{q}\t{text}\n" for q, text, _, _, _ in QUESTIONS))
    (data / "qrel_evidence.txt").write_text("".join(f"{q} Q0 {d} 1\n" for q, _, _, d, _ in QUESTIONS))
    (data / "qrel_golds.txt").write_text("".join(f"{q} Q0 {d} 1\n" for q, _, _, d, gold in QUESTIONS if gold))
    return data


def _fact(docid: str, n: int, variant: str = "") -> dict[str, Any]:
    start, end = sentence_spans(DOCS[docid])[n - 1]
    sentence = DOCS[docid][start:end].rstrip(".")
    return {
        "title": sentence,
        "description": f"{sentence}, as stated about {docid.upper()}.",
        "subject": docid.upper(),
        "predicate": f"fact_{n}{variant}",
        "object": sentence.split()[-1],
        "evidence_sentences": [n],
        "confidence": 80,
        "tags": ["place"],
    }


class Stub:
    """Counts requests per (docid, what was asked) and answers per the module docstring."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def __call__(self, request: RecordedRequest) -> Reply:
        text = request_text(request)
        docid = re.findall(r"\[\[ ## docid ## \]\]\s*\n([^\n]*)", text)[-1].strip()
        n_sent = len(sentence_spans(DOCS[docid]))
        rf = request.body.get("response_format")
        focus = re.findall(r"\[\[ ## sentence ## \]\]\s*\n(\d+)", text)
        if focus:
            kind, cited = "sentence", [int(focus[-1])]
        elif "Zeta Corp makes zips" in text:
            kind = "demos+limits" if "maxLength" in json.dumps(rf) else "demos"
            cited = list(range(1, n_sent + 1))
        elif rf is None:
            kind, cited = "no-format", [1]
        elif rf["schema"]["properties"]["facts"].get("minItems") == 3:
            kind, cited = "min-items", list(range(1, n_sent + 1))
        elif "maxLength" in json.dumps(rf["schema"]):
            record = next(iter(rf["schema"]["$defs"].values()))["properties"]
            assert (record["title"]["maxLength"], record["description"]["maxLength"]) == (140, 350)
            assert (record["evidence_sentences"]["minItems"], record["evidence_sentences"]["maxItems"]) == (
                1,
                3,
            )
            kind, cited = "limits", [2]
        else:
            assert rf["type"] == "json_object" and "facts" in rf["schema"]["properties"]  # the grammar
            kind, cited = "schema", [1, 2]
        with self._lock:
            self.seen.append((docid, kind))
        # asked about one sentence, three facts of it: with 3 sentences that is 9, over the cap of 6
        suffixes = ("", "_b", "_c") if kind == "sentence" else ("",)
        facts = [_fact(docid, n, x) for n in cited for x in suffixes]
        return Reply.ok(json.dumps({"facts": facts}), usage=(500, 40 * len(facts)))


def _make_lm(url: str):  # type: ignore[no-untyped-def]
    def make(cfg: Any, ledger: Any) -> KituneLM:
        lm = stub_server_lm(
            url,
            is_local=True,  # LocalJSONAdapter: the schema as {"type": "json_object", "schema": ...}
            model="openai/local-stub",
            api_key="sk-local",
            max_tokens=cfg.lm.extract.max_tokens,
            ledger=ledger,
        )
        # as build_lm does: the calls recorded, or answered from a recording (no stub reached)
        if cfg.lm.replay_dir is not None:
            lm.recorder = get_recorder(cfg.lm.replay_dir, "replay")
        else:
            lm.recorder = get_recorder(cfg.lm.record_dir, "record")
        return lm

    return make


def test_every_variant_is_measured_resumed_and_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = _write_fixture(tmp_path)
    demos = tmp_path / "demos.json"
    demos.write_text(json.dumps({"demos": [{"docid": "z9", "facts": [_fact("z9", 1), _fact("z9", 2)]}]}))
    monkeypatch.setattr(extraction_variants, "DEMOS", demos)
    reset_format_memory()
    reset_recorders()
    argv = [
        "--data",
        str(data),
        "--work",
        str(tmp_path / "work"),
        "--out-dir",
        str(tmp_path),
        "--no-progress",
    ]
    argv += ["--determinism", "1"]
    stub = Stub()
    with StubServer(responder=stub) as server:
        results = main(argv, make_lm=_make_lm(server.base_url))
        first_calls = len(stub.seen)
        again = main(argv, make_lm=_make_lm(server.base_url))  # everything cached: no request
        screen = ["--questions", "2", "--variants", "default", "--name", "screen"]
        screened = main([*argv[:-2], *screen], make_lm=_make_lm(server.base_url))
    assert len(stub.seen) == first_calls  # the rerun and the screen read the caches: no request
    assert again == results
    # a screen: the first 2 questions and their documents (g1, a prefix of the full run's)
    assert (screened["default"]["docs"], screened["default"]["covered"]) == (1, ["1"])
    assert json.loads((tmp_path / "screen.json").read_text())["params"]["documents"] == ["g1"]
    figures = {
        name: (r["docs"], r["kis_total"], r["kis_per_doc"], r["coverage"], r["covered"], r["lm_calls"])
        for name, r in results.items()
    }
    assert figures == {
        "default": (2, 4, 2.0, 2, ["1", "3"], 2),
        "no-grammar": (2, 2, 1.0, 1, ["1"], 2),
        "min3": (2, 5, 2.5, 3, ["1", "2", "3"], 2),
        "schema-limits": (2, 2, 1.0, 1, ["3"], 2),
        "per-sentence": (2, 12, 6.0, 2, ["1", "3"], 5),  # a call per sentence; cap 6 cuts Carol King
        "few-shot": (2, 5, 2.5, 3, ["1", "2", "3"], 2),
        "few-shot-limits": (2, 5, 2.5, 3, ["1", "2", "3"], 2),
        "cap15": (2, 4, 2.0, 2, ["1", "3"], 2),
        "per-sentence-cap15": (2, 15, 7.5, 3, ["1", "2", "3"], 5),  # per-sentence's calls, cap 15
    }
    # the demonstration is never a measured document, and z9 was never extracted
    assert {d for d, _ in stub.seen} == {"g1", "g2"}
    kinds = {(d, k) for d, k in stub.seen}
    assert ("g1", "sentence") in kinds and ("g1", "demos") in kinds and ("g2", "no-format") in kinds
    assert ("g2", "limits") in kinds and ("g2", "demos+limits") in kinds
    r = results["per-sentence"]
    assert (
        r["output_tokens_per_doc"] == 5 * 3 * 40 / 2
        and r["docs_with_3_kis"] == 2
        and r["status"] == {"ok": 2}
    )
    assert r["drops"] == {"over_cap": 3}
    # the cap changes no request: per-sentence-cap15 replayed per-sentence's recorded calls
    assert sum(k == "sentence" for _, k in stub.seen) == 5
    capped = results["per-sentence-cap15"]
    assert capped["replayed_from"] == "per-sentence" and capped["drops"] == {}
    assert capped["output_tokens_per_doc"] == r["output_tokens_per_doc"] and capped["wall_s"] == r["wall_s"]
    assert (tmp_path / "work").glob("per-sentence.*.calls")
    assert results["default"]["kis_per_sentence"] == 4 / 5 and results["default"]["drops"] == {}
    saved = json.loads((tmp_path / "extraction_variants.json").read_text())
    assert saved["params"]["answer_ceiling"] == ["1", "2", "3"] and saved["params"]["documents"] == [
        "g1",
        "g2",
    ]
    assert saved["results"]["determinism"] == {"docs": 1, "identical": 1, "different": [], "concurrency": 4}
    md = (tmp_path / "extraction_variants.md").read_text()
    assert "| per-sentence | one call per numbered sentence | 2 | 6.00 | 2/2 | 2/3 |" in md
    assert "Ceiling: the answer is in a gold document's own text for 3/3 questions." in md


def test_a_demonstration_from_a_measured_document_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = _write_fixture(tmp_path)
    demos = tmp_path / "demos.json"
    demos.write_text(json.dumps({"demos": [{"docid": "g2", "facts": [_fact("g2", 1)]}]}))
    monkeypatch.setattr(extraction_variants, "DEMOS", demos)
    argv = [
        "--data",
        str(data),
        "--work",
        str(tmp_path / "w"),
        "--out-dir",
        str(tmp_path),
        "--variants",
        "few-shot",
    ]
    with pytest.raises(ValueError, match="demonstration document g2 is measured"):
        main(argv, make_lm=_make_lm("http://127.0.0.1:9/v1"))


def test_the_committed_demonstrations_are_from_fixture_paragraphs_no_question_uses(fixture_dir: Path) -> None:
    from kitune.data.loaders import load_corpus

    docs, questions, _ = extraction_variants.measured_documents(fixture_dir, "evidence")
    measured = {d.docid for d in docs}
    corpus = {d.docid: d for d in load_corpus(fixture_dir)}
    demos = extraction_variants.load_demos(extraction_variants.DEMOS, corpus, measured)
    assert [d.docid for d in demos] == ["200095", "200545"] and len(questions) == 24
    assert all(len(d.facts) == 6 for d in demos)
    assert demos[0].text.startswith("[1] NASCAR Revolution is a racing video game")
