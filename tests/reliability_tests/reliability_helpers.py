"""Shared set-up for the reliability tests: fixture slices, good replies, stub configs."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kitune.config import KituneConfig, load_config
from kitune.data.loaders import Question
from kitune.schema import Document
from kitune.testing.faults import dspy_docid, request_text
from kitune.testing.openai_stub import RecordedRequest

NOW = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)

_SENT = re.compile(r"(?<=[.!?])\s+")


def facts_for(doc: Document) -> list[dict[str, Any]]:
    """Two deterministic, verifiable facts for ``doc`` (evidence = its first two sentences)."""
    out = []
    for i, sentence in enumerate(s for s in _SENT.split(doc.text) if len(s.split()) >= 4):
        if i == 2:
            break
        evidence = " ".join(sentence.split()[:12])
        evidence = doc.text[doc.text.find(evidence.split()[0]) :][: len(evidence)]
        if evidence not in doc.text:  # whitespace differences: fall back to the raw prefix
            evidence = sentence[:80]
        subject = f"Entity {doc.docid}"
        obj = f"value {i} of {doc.docid}"
        pred = ("first_fact", "second_fact")[i]
        out.append(
            {
                "title": f"{subject} has {pred.replace('_', ' ')} {obj}",
                "description": f"{subject} has {pred.replace('_', ' ')} {obj}.",
                "subject": subject,
                "predicate": pred,
                "object": obj,
                "evidence_span": evidence,
                "confidence": 80,
                "tags": ["fact"],
            }
        )
    return out


def extraction_reply(docs: dict[str, Document]) -> Any:
    """A ``good`` callable for :class:`FaultyProvider`: the JSON facts for the request's document."""

    def good(request: RecordedRequest) -> str:
        doc = docs.get(dspy_docid(request))
        return json.dumps(facts_for(doc)) if doc is not None else "[]"

    return good


_QUESTION = re.compile(r"Question: (?P<q>[^\n]*)")


def question_key(request: RecordedRequest) -> str:
    """The question text of an agent request (first ``Question:`` line)."""
    m = _QUESTION.search(request_text(request))
    return m.group("q").strip() if m else ""


def agent_reply(questions: list[Question]) -> Any:
    """A ``good`` callable: the agent answers every question with its gold answer."""
    gold = {q.query: q.answer for q in questions}

    def good(request: RecordedRequest) -> str:
        answer = gold.get(question_key(request), "unknown")
        return json.dumps(
            {"answer": {"explanation": "From memory [none].", "exact_answer": answer, "confidence": 70}}
        )

    return good


def stub_config(base_url: str, workdir: Path | None = None, **overrides: object) -> KituneConfig:
    """A config whose gateway is the stub at ``base_url`` (env vars must be set by the caller)."""
    base: dict[str, object] = {
        "lm.gateway.base_url_env": "KI_GW_URL",
        "lm.gateway.api_key_env": "KI_GW_KEY",
        "lm.gateway.default_model": "m-small",
        "extraction.concurrency": 2,
        "extraction.write_batch_size": 8,
    }
    if workdir is not None:
        base["workdir"] = str(workdir)
    base.update(overrides)
    return load_config(overrides=base)


def fixture_slice(fixture_dir: Path, n: int) -> list[Document]:
    """The first ``n`` fixture documents."""
    from kitune.data.loaders import load_corpus

    return load_corpus(fixture_dir)[:n]


WORKER = Path(__file__).with_name("crash_worker.py")


def run_with_kills(
    cmd: list[str], *, kills: int, rng: random.Random, max_delay_s: float, log: Path
) -> list[str]:
    """Start ``cmd`` up to ``kills`` times, SIGKILL it a random time after ``READY``, then finish it.

    Returns:
        One outcome per start: ``"killed@<s>"``, ``"exit <rc>"`` (it finished before the kill),
        and last the uninterrupted finishing run's ``"final exit <rc>"``.
    """
    outcomes: list[str] = []
    with log.open("a", encoding="utf-8") as err:
        for _ in range(kills):
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
            assert proc.stdout is not None
            first = proc.stdout.readline()
            if not first.startswith("READY"):
                proc.wait()
                outcomes.append(f"exit {proc.returncode} before READY")
                continue
            delay = rng.uniform(0.0, max_delay_s)
            time.sleep(delay)
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
                outcomes.append(f"killed@{delay:.2f}s")
            else:
                outcomes.append(f"exit {proc.returncode}")
            proc.stdout.close()
        final = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, text=True, check=False)
    outcomes.append(f"final exit {final.returncode}")
    return outcomes


def worker_cmd(
    job: str, workdir: Path, n: int, corpus: Path | None = None, *, base_url: str = "", pace: float = 0.1
) -> list[str]:
    """The command line of one :mod:`crash_worker` job (``base_url`` given: through the stub)."""
    cmd = [sys.executable, str(WORKER), job, "--workdir", str(workdir), "--n", str(n), "--pace", str(pace)]
    if base_url:
        cmd += ["--lm", "stub", "--base-url", base_url]
    if corpus is not None:
        cmd += ["--corpus", str(corpus)]
    return cmd


def store_snapshot(path: Path) -> dict[str, dict[str, Any]]:
    """KI id → its JSON dump, read from the LanceStore at ``path``."""
    from kitune.retrieval.lance import LanceStore

    store = LanceStore(path)
    try:
        return {ki.id: ki.model_dump(mode="json") for ki in store.iter_kis()}
    finally:
        store.close()


def trace_rows(path: Path) -> list[tuple[Any, ...]]:
    """The deterministic part of each trace line (wall times and latencies left out), sorted."""
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        t = json.loads(line)
        rows.append(
            (
                t["query_id"],
                t["status"],
                t["exact_answer"],
                t["n_steps"],
                t["input_tokens"],
                t["output_tokens"],
            )
        )
    return sorted(rows)
