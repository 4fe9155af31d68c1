"""Soak and fault run: the long version of tests/reliability_tests (no real LLM needed).

Three phases over a slice of a dataset in the BrowseComp-Plus layout, each checked against
invariants; every violation is listed and makes the exit code 1:

1. **faults** — extraction (``extract_corpus`` through ``build_lm``) and eval (``evaluate`` with
   ``LiteLLMChatModel``) against a local OpenAI-compatible stub that injects seeded random faults
   (429 + Retry-After, 500/503, timeouts, truncated JSON with finish_reason=length, empty choices,
   prose) at ``--fault-rate``. Invariants: every document/question accounted for (done or failed
   with a reason), state file complete, ``kis_written == store.count()``, no answer other than
   the gold one (nothing fabricated), the cut-off record of a truncated reply never stored; then a
   fault-free rerun (the provider recovered) finishes every failed document and question, and
   readers see one trace per question.
2. **crash** — ``--rounds`` rounds of: SIGKILL extraction and eval children (through the stub and
   the real LM layer) ``--kills`` times at seeded random points, resume, and compare with an
   uninterrupted run (same KIs field for field; one trace line per question, same answers).
3. **summary** — counts printed and written to ``<out>/soak.json`` and ``<out>/soak.md``.

Run (about 10 minutes with the defaults on 2 busy cores)::

    python scripts/soak.py --data ../shared/data/dev --docs 120 --questions 40 --rounds 3 \\
        --fault-rate 0.3 --seed 1 --out benchmarks/results
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "reliability_tests"))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("KI_GW_KEY", "sk-soak-not-a-secret")


def _cfg(base_url: str, workdir: Path, **extra: object) -> Any:
    from reliability_helpers import stub_config

    os.environ["KI_GW_URL"] = base_url
    return stub_config(base_url, workdir, **extra)


def phase_faults(args: argparse.Namespace, work: Path, violations: list[str]) -> dict[str, Any]:
    """Extraction and eval under seeded random faults, then a clean rerun."""
    import dspy
    from reliability_helpers import NOW, agent_reply, extraction_reply, facts_for, question_key

    from kitune.data.loaders import load_corpus, load_questions
    from kitune.evaluation.agent import Agent
    from kitune.evaluation.budget import Budget
    from kitune.evaluation.harness import evaluate, read_traces
    from kitune.evaluation.tools import closed_book_toolbox
    from kitune.ki import ki_id
    from kitune.lm import LiteLLMChatModel, build_lm
    from kitune.programs.fact_extractor import FactExtractor
    from kitune.retrieval.memory import MemoryStore
    from kitune.service.pipelines.extraction import extract_corpus, read_state
    from kitune.testing.faults import FaultPlan, FaultyProvider, dspy_docid
    from kitune.testing.openai_stub import StubServer
    from kitune.usage import TokenLedger

    docs = load_corpus(args.data)[: args.docs]
    by_id = {d.docid: d for d in docs}
    plan = FaultPlan(seed=args.seed, rate=args.fault_rate, timeout_delay_s=1.5, retry_after_s=0.05)
    provider = FaultyProvider(good=extraction_reply(by_id), key=dspy_docid, plan=plan)
    out: dict[str, Any] = {}
    store = MemoryStore()
    state = work / "faults" / "state.jsonl"
    with StubServer(responder=provider) as stub:
        cfg = _cfg(
            stub.base_url,
            work / "faults",
            **{"lm.extract.num_retries": 2, "lm.extract.timeout_s": 1.0, "extraction.concurrency": 4},
        )
        ledger = TokenLedger()
        lm = build_lm(cfg, "extract", ledger=ledger, backoff_base_s=0.02, max_wait_s=0.3)
        t0 = time.monotonic()
        with dspy.context(lm=lm):
            rep = extract_corpus(
                docs,
                store,
                FactExtractor.from_config(cfg),
                cfg=cfg,
                ledger=ledger,
                state_path=state,
                progress=False,
                now=NOW,
            )
        wall = time.monotonic() - t0
        if rep.docs_done + rep.docs_failed != len(docs):
            violations.append(f"extract: done {rep.docs_done} + failed {rep.docs_failed} != {len(docs)}")
        if set(read_state(state)) != set(by_id):
            violations.append("extract: state file does not cover every document")
        if rep.kis_written != store.count():
            violations.append(f"extract: kis_written {rep.kis_written} != store count {store.count()}")
        violations += [f"extract: {d} failed without a reason" for d, why in rep.failed.items() if not why]
        stored = {k.id for k in store.iter_kis()}
        for docid in rep.truncated:  # the record cut off by the token limit is never stored
            facts = facts_for(by_id[docid])
            if len(facts) > 1:
                cut = facts[1]
                if ki_id(docid, cut["subject"], cut["predicate"], cut["object"]) in stored:
                    violations.append(f"extract: cut-off record of {docid} was stored")
        provider.plan = FaultPlan(seed=args.seed, rate=0.0)  # the provider recovers
        with dspy.context(lm=lm):
            again = extract_corpus(
                docs,
                store,
                FactExtractor.from_config(cfg),
                cfg=cfg,
                ledger=ledger,
                state_path=state,
                progress=False,
                now=NOW,
            )
        if (
            again.docs_done != rep.docs_failed
            or again.docs_failed
            or set(read_state(state).values()) != {"ok"}
        ):
            violations.append(
                f"extract rerun: {again.docs_done} done / {again.docs_failed} failed, "
                f"expected {rep.docs_failed} / 0"
            )
        out["extract"] = {
            "docs": len(docs),
            "done": rep.docs_done,
            "failed": rep.docs_failed,
            "failed_by_reason": dict(Counter(why.split(":")[0][:60] for why in rep.failed.values())),
            "truncated_docs": len(rep.truncated),
            "kis_written": rep.kis_written,
            "parse_failures": rep.parse_failures,
            "extractor_retries": rep.counters.get("retries", 0),
            "lm_calls": rep.tokens.get("calls", 0),
            "failed_calls": rep.tokens.get("failed_calls", 0),
            "faults_injected": dict(provider.injected),
            "rerun_done": again.docs_done,
            "rerun_failed": again.docs_failed,
            "kis_after_rerun": store.count(),
            "wall_s": round(wall, 1),
        }

    questions = load_questions(args.data)[: args.questions]
    qprov = FaultyProvider(good=agent_reply(questions), key=question_key, plan=plan)
    traces_path = work / "faults" / "traces.jsonl"
    with StubServer(responder=qprov) as stub:
        cfg = _cfg(stub.base_url, work / "faults", **{"lm.agent.num_retries": 2, "lm.agent.timeout_s": 1.0})
        lm = build_lm(cfg, "agent", backoff_base_s=0.02, max_wait_s=0.3)

        def factory(q: Any) -> Agent:
            return Agent(LiteLLMChatModel(lm=lm), closed_book_toolbox(), budget=Budget(max_steps=5))

        t0 = time.monotonic()
        traces = evaluate(
            questions, factory, skill="closed-book", concurrency=4, traces_path=traces_path, progress=False
        )
        wall = time.monotonic() - t0
        gold = {q.query_id: q.answer for q in questions}
        status = Counter(t.status for t in traces)
        if len(traces) != len(questions) or len(read_traces(traces_path)) != len(questions):
            violations.append("eval: not one trace per question")
        for t in traces:
            if t.status == "answered" and t.exact_answer != gold[t.query_id]:
                violations.append(f"eval: {t.query_id} answered {t.exact_answer!r}, not the only reply given")
            if t.status == "failed" and not t.errors:
                violations.append(f"eval: {t.query_id} failed without a reason")
        qprov.plan = FaultPlan(seed=args.seed, rate=0.0)  # the provider recovers: failed ones rerun
        rerun = evaluate(
            questions, factory, skill="closed-book", concurrency=4, traces_path=traces_path, progress=False
        )
        rerun_status = Counter(t.status for t in rerun)
        if rerun_status != Counter({"answered": len(questions)}):
            violations.append(f"eval rerun: {dict(rerun_status)}, expected every question answered")
        if [t.exact_answer for t in rerun] != [gold[q.query_id] for q in questions]:
            violations.append("eval rerun: an answer differs from the only reply given")
        if len(read_traces(traces_path)) != len(questions):
            violations.append("eval rerun: readers do not see exactly one trace per question")
        out["eval"] = {
            "questions": len(questions),
            "status": dict(status),
            "rerun_status": dict(rerun_status),
            "trace_lines_on_disk": len(read_traces(traces_path, latest_only=False)),
            "invalid_steps": sum(1 for t in traces for s in t.steps if s.get("kind") == "invalid"),
            "faults_injected": dict(qprov.injected),
            "wall_s": round(wall, 1),
        }
    return out


def phase_crash(args: argparse.Namespace, work: Path, violations: list[str]) -> dict[str, Any]:
    """Kill -9 extraction and eval children through the stub, resume, compare with a clean run."""
    from crash_worker import questions as worker_questions
    from reliability_helpers import (
        agent_reply,
        extraction_reply,
        question_key,
        run_with_kills,
        store_snapshot,
        trace_rows,
        worker_cmd,
    )

    from kitune.data.loaders import load_corpus
    from kitune.testing.faults import FaultyProvider, dspy_docid, scripted
    from kitune.testing.openai_stub import StubServer

    docs = {d.docid: d for d in load_corpus(args.data)[: args.crash_docs]}
    rng = random.Random(args.seed)
    rounds: list[dict[str, Any]] = []
    eprov = FaultyProvider(good=extraction_reply(docs), key=dspy_docid, plan=scripted({}), delay_s=0.05)
    qs = worker_questions(args.crash_questions)
    qprov = FaultyProvider(good=agent_reply(qs), key=question_key, plan=scripted({}), delay_s=0.1)
    with StubServer(responder=eprov) as estub, StubServer(responder=qprov) as qstub:
        log = work / "crash" / "workers.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        clean = work / "crash" / "clean"
        run_with_kills(
            worker_cmd("extract", clean, len(docs), args.data, base_url=estub.base_url),
            kills=0,
            rng=rng,
            max_delay_s=0,
            log=log,
        )
        run_with_kills(
            worker_cmd("eval", clean, len(qs), base_url=qstub.base_url),
            kills=0,
            rng=rng,
            max_delay_s=0,
            log=log,
        )
        want_kis, want_traces = store_snapshot(clean / "lance"), trace_rows(clean / "traces.jsonl")
        for r in range(args.rounds):
            d = work / "crash" / f"round{r}"
            ex = run_with_kills(
                worker_cmd("extract", d, len(docs), args.data, base_url=estub.base_url),
                kills=args.kills,
                rng=rng,
                max_delay_s=args.max_kill_delay,
                log=log,
            )
            ev = run_with_kills(
                worker_cmd("eval", d, len(qs), base_url=qstub.base_url),
                kills=args.kills,
                rng=rng,
                max_delay_s=args.max_kill_delay,
                log=log,
            )
            got_kis, got_traces = store_snapshot(d / "lance"), trace_rows(d / "traces.jsonl")
            lost = len(set(want_kis) - set(got_kis))
            extra = len(set(got_kis) - set(want_kis))
            differ = sum(1 for k in set(want_kis) & set(got_kis) if want_kis[k] != got_kis[k])
            ok = ex[-1] == ev[-1] == "final exit 0" and got_kis == want_kis and got_traces == want_traces
            if not ok:
                violations.append(
                    f"crash round {r}: extract {ex}, eval {ev}, lost {lost}, extra {extra}, "
                    f"differ {differ}, traces equal {got_traces == want_traces}"
                )
            rounds.append(
                {
                    "round": r,
                    "extract_runs": ex,
                    "eval_runs": ev,
                    "kis": len(got_kis),
                    "lost": lost,
                    "extra": extra,
                    "differ": differ,
                    "trace_lines": len(got_traces),
                    "traces_equal": got_traces == want_traces,
                }
            )
    kills = sum(o.startswith("killed") for r in rounds for o in r["extract_runs"] + r["eval_runs"])
    return {
        "docs": len(docs),
        "questions": len(qs),
        "clean_kis": len(want_kis),
        "kills": kills,
        "rounds": rounds,
    }


def _markdown(summary: dict[str, Any]) -> str:
    f, c = summary["faults"], summary["crash"]
    lines = [
        "# Soak results",
        "",
        f"Command: `{summary['command']}`  ",
        f"When: {summary['finished_at']} · wall {summary['wall_s']} s · {summary['machine']}",
        "",
        f"**Invariant violations: {len(summary['violations'])}**",
        *[f"- {v}" for v in summary["violations"]],
        "",
        "## Faults (seeded random, rate {rate})".format(rate=summary["args"]["fault_rate"]),
        "",
        "| extraction | value |",
        "|---|---|",
        *[f"| {k} | {v} |" for k, v in f["extract"].items()],
        "",
        "| eval | value |",
        "|---|---|",
        *[f"| {k} | {v} |" for k, v in f["eval"].items()],
        "",
        "## Crash and resume (kill -9)",
        "",
        f"{c['docs']} documents ({c['clean_kis']} KIs in the clean run), {c['questions']} questions, "
        f"{c['kills']} kills over {len(c['rounds'])} rounds.",
        "",
        "| round | extract runs | eval runs | KIs | lost | extra | differ | trace lines | traces equal |",
        "|---|---|---|---|---|---|---|---|---|",
        *[
            f"| {r['round']} | {', '.join(r['extract_runs'])} | {', '.join(r['eval_runs'])} | {r['kis']} | "
            f"{r['lost']} | {r['extra']} | {r['differ']} | {r['trace_lines']} | {r['traces_equal']} |"
            for r in c["rounds"]
        ],
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the soak; exit 0 when no invariant was violated."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "fixture")
    p.add_argument("--docs", type=int, default=60, help="documents in the fault phase")
    p.add_argument("--questions", type=int, default=24, help="questions in the fault phase")
    p.add_argument("--fault-rate", type=float, default=0.3, help="probability that one LM attempt fails")
    p.add_argument("--rounds", type=int, default=3, help="crash/resume rounds")
    p.add_argument("--kills", type=int, default=3, help="kills per job per round")
    p.add_argument("--crash-docs", type=int, default=24)
    p.add_argument("--crash-questions", type=int, default=16)
    p.add_argument("--max-kill-delay", type=float, default=4.0, help="seconds after READY, at most")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    p.add_argument("--workdir", type=Path, default=None, help="scratch folder (default: a temp dir)")
    args = p.parse_args(argv)
    violations: list[str] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kitune-soak-") as tmp:
        work = args.workdir or Path(tmp)
        print(
            f"soak: faults phase ({args.docs} docs, {args.questions} questions, rate {args.fault_rate})",
            flush=True,
        )
        faults = phase_faults(args, work, violations)
        print(json.dumps(faults, indent=2), flush=True)
        print(f"soak: crash phase ({args.rounds} rounds x {args.kills} kills per job)", flush=True)
        crash = phase_crash(args, work, violations)
    summary = {
        "command": "python scripts/soak.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "wall_s": round(time.monotonic() - started, 1),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "violations": violations,
        "faults": faults,
        "crash": crash,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "soak.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    (args.out / "soak.md").write_text(_markdown(summary), encoding="utf-8")
    print(_markdown(summary))
    print(f"wrote {args.out / 'soak.json'} and {args.out / 'soak.md'}")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
