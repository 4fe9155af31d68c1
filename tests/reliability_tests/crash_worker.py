"""Child process for the crash/resume tests and the soak script (run, then killed with SIGKILL).

Usage::

    python crash_worker.py extract --workdir DIR --corpus PATH --n 12 [--lm stub --base-url URL]
    python crash_worker.py eval    --workdir DIR --n 10 [--lm stub --base-url URL]

``extract`` runs :func:`kitune.service.pipelines.extraction.extract_corpus` into a LanceStore at
``DIR/lance`` with the resume file ``DIR/state.jsonl``; ``eval`` runs
:func:`kitune.evaluation.harness.evaluate` (closed-book agent) appending to ``DIR/traces.jsonl``.
With ``--lm stub`` both talk to the OpenAI-compatible stub at URL through the real LM layer
(the soak script; LiteLLM's import alone takes seconds, too slow for many CI restarts). With
``--lm dummy`` (default) they use deterministic in-process doubles: DSPy's ``DummyLM`` keyed on
each document's opening text, and a ``ScriptedChatModel`` answering each question's gold
answer; ``--pace`` seconds of sleep per document/question stretch the run so kills land inside
it. ``READY`` is printed (and flushed) once set-up is done, so the parent times its kill into
the real work.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kitune.config import KituneConfig
    from kitune.data.loaders import Question

NOW = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)


def questions(n: int) -> list[Question]:
    """The synthetic questions shared by the parent (the answers the stub gives)."""
    from kitune.data.loaders import Question

    return [
        Question(query_id=f"q{i}", query=f"Which town is number {i}?", answer=f"Town {i}", evidence_docids=())
        for i in range(n)
    ]


def _cfg(base_url: str, workdir: Path) -> KituneConfig:
    from kitune.config import load_config

    os.environ["KI_GW_URL"] = base_url
    os.environ.setdefault("KI_GW_KEY", "sk-test-secret-9876")
    return load_config(
        overrides={
            "workdir": str(workdir),
            "lm.gateway.base_url_env": "KI_GW_URL",
            "lm.gateway.api_key_env": "KI_GW_KEY",
            "lm.gateway.default_model": "m-small",
            "extraction.concurrency": 2,
            "extraction.write_batch_size": 3,
        }
    )


def main(argv: list[str] | None = None) -> int:
    """Run one job; exit 0 when it finished."""
    p = argparse.ArgumentParser()
    p.add_argument("job", choices=["extract", "eval"])
    p.add_argument("--lm", choices=["dummy", "stub"], default="dummy")
    p.add_argument("--base-url", default="")
    p.add_argument("--pace", type=float, default=0.1)
    p.add_argument("--workdir", type=Path, required=True)
    p.add_argument("--corpus", type=Path)
    p.add_argument("--n", type=int, default=10)
    args = p.parse_args(argv)
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

    import dspy

    from kitune.lm import build_lm

    dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=False)
    cfg = _cfg(args.base_url, args.workdir)
    if args.job == "extract":
        from kitune.programs.fact_extractor import FactExtractor
        from kitune.retrieval.lance import LanceStore
        from kitune.service.pipelines.extraction import extract_corpus, load_documents

        docs = load_documents(args.corpus, limit=args.n)
        store = LanceStore(args.workdir / "lance")
        lm: object
        if args.lm == "stub":
            lm = build_lm(cfg, "extract")
        else:
            from dspy.utils.dummies import DummyLM
            from reliability_helpers import facts_for

            lm = DummyLM({d.text[:80]: {"facts_json": json.dumps(facts_for(d))} for d in docs})
        print("READY", flush=True)
        with dspy.context(lm=lm):
            report = extract_corpus(
                docs,
                store,
                FactExtractor.from_config(cfg),
                cfg=cfg,
                state_path=args.workdir / "state.jsonl",
                progress=False,
                now=NOW,
                on_result=lambda _r: time.sleep(args.pace),
            )
        store.close()
        print(
            f"DONE done={report.docs_done} skipped={report.docs_skipped} failed={report.docs_failed}",
            flush=True,
        )
        return 0 if report.docs_failed == 0 else 1

    from kitune.evaluation.agent import Agent
    from kitune.evaluation.harness import evaluate
    from kitune.evaluation.tools import closed_book_toolbox
    from kitune.lm import LiteLLMChatModel
    from kitune.testing.chat import ScriptedChatModel

    agent_lm = build_lm(cfg, "agent") if args.lm == "stub" else None

    def factory(q: Question) -> Agent:
        if agent_lm is not None:
            return Agent(LiteLLMChatModel(lm=agent_lm), closed_book_toolbox())
        time.sleep(args.pace)
        reply = json.dumps(
            {"answer": {"explanation": "From memory.", "exact_answer": q.answer, "confidence": 70}}
        )
        return Agent(ScriptedChatModel([reply], usage=(100, 20)), closed_book_toolbox())

    print("READY", flush=True)
    traces = evaluate(
        questions(args.n),
        factory,
        skill="closed-book",
        concurrency=2,
        traces_path=args.workdir / "traces.jsonl",
        progress=False,
    )
    print(f"DONE traces={len(traces)}", flush=True)
    return 0 if all(t.status == "answered" for t in traces) else 1


if __name__ == "__main__":
    sys.exit(main())
