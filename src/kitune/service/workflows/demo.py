"""``kitune demo``: the README's main job, end to end on a small slice of real data.

Steps (everything under ``<workdir>/demo/``, resumable: a rerun reuses finished work):

1. load the first ``--questions`` questions of the fixture (the one that ships inside the
   package, :func:`kitune.data.bundled.packaged_fixture`, or ``--data``), their evidence
   documents and ``--distractors`` others;
2. **extract** KIs from those documents into the embedded store;
3. evaluate the **baseline** (search-and-fetch over the same documents), **in-context**
   (``get_context`` over KIs, disambiguation KIs hidden);
4. **feedback**: each in-context failure goes through the disambiguator; accepted KIs are
   written to the store; then **in-context + disambiguation** is evaluated and the flips counted;
5. **one optimisation iteration** of the loop (GEPA over the ``--programs``, default the
   extractor), logged to MLflow, accepted prompts registered;
6. the side-by-side table (accuracy by the configured grader, EM, F1, input tokens per question, timeouts),
   ``report.md``/``report.png`` and where the MLflow runs are.

Time budget with the default slice (4 questions, ~9 evidence docs + 2 distractors) and the
embedded 1.5B model on 2 cores (~10 tokens/s generation, ~60 tokens/s prompt processing; the
shared instruction prefix is cached by llama.cpp): extraction ~11 docs × ~35 s ≈ 6.5 min;
three agent runs × 4 questions × (~4 steps × ~12 s + judge ~10 s) ≈ 11 min; feedback ≈ 1 min;
one GEPA round on the extractor (4 metric calls + 1 reflection) ≈ 3.5 min, plus, only if a
better prompt is found, re-extraction of the validation documents and a 2-question evaluation
≈ 6 min. Total ≈ 22 min (≈ 28 min when a candidate is found).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import kitune.localmodel
import kitune.retrieval
from kitune.config import KituneConfig, with_overrides
from kitune.data.bundled import packaged_demo_config, packaged_fixture
from kitune.data.checksum import dataset_checksum
from kitune.evaluation.agent import Agent
from kitune.evaluation.budget import Budget
from kitune.evaluation.harness import evaluate
from kitune.evaluation.report import ReportFiles, RunSummary, write_report
from kitune.evaluation.tools import build_toolbox
from kitune.optimizers.feedback import (
    FeedbackReport,
    Flips,
    collect_failures,
    count_flips,
)
from kitune.optimizers.feedback_step import write_setting_kis
from kitune.optimizers.loop import LoopResult, Setting, start_prompts
from kitune.service.tuning import optimize as optimize_service
from kitune.service.tuning.loop_env import LoopDeps, ServiceLoopEnv
from kitune.service.tuning.options import OptimizeOptions
from kitune.service.tuning.slice_fingerprint import write_fingerprint
from kitune.service.tuning.slicing import load_slice
from kitune.tracking.prompts import PromptRegistry
from kitune.tracking.runner import run_experiment
from kitune.usage import TokenLedger

if TYPE_CHECKING:
    from kitune.evaluation.metrics import Trace
    from kitune.optimizers.protocols import Tracker

__all__ = ["DemoOptions", "DemoResult", "default_demo_config", "default_fixture", "run_demo"]


def default_fixture() -> Path:
    """The fixture that ships inside the package (``kitune/resources/fixture``; no ``../shared`` needed)."""
    return packaged_fixture()


def default_demo_config() -> Path:
    """The demo's ``demo.yaml`` inside the package (``configs/experiments/demo.yaml`` links to it)."""
    return packaged_demo_config()


@dataclass(frozen=True)
class DemoOptions:
    """Sizes of the demo (every one is a ``kitune demo`` flag)."""

    data_dir: Path | None = None
    """Dataset folder; None: :func:`default_fixture`."""
    questions: int = 4
    distractors: int = 2
    iterations: int = 1
    programs: tuple[str, ...] = ("extractor",)
    optimizer: str = "gepa"
    max_metric_calls: int | None = None
    """None: ``optimize.max_metric_calls``, else sized to ``optimize.min_proposals`` proposals."""
    knob_trials: int = 5
    budget_minutes: float | None = None
    progress: bool = True


@dataclass(frozen=True)
class DemoResult:
    """What :func:`run_demo` produced."""

    summaries: list[RunSummary]
    """baseline, in-context, in-context + disambiguation (display order)."""
    report: ReportFiles
    feedback: FeedbackReport
    flips: Flips
    loop: LoopResult
    demo_dir: Path
    mlflow_uri: str
    usage: dict[str, dict[str, int]] = field(default_factory=dict)
    extract_failed: tuple[str, ...] = ()
    """Documents whose extraction failed (their KIs are missing from every arm); a rerun retries them."""
    extract_retried: tuple[str, ...] = ()
    """Documents whose extraction timed out and was tried once more with twice the timeout."""


def failed_documents_line(docids: Sequence[str]) -> str:
    """One line naming the documents whose extraction failed, and what to do about them."""
    return (
        f"{len(docids)} document(s) failed to extract ({', '.join(docids)}), so their KIs are missing "
        "from every arm; the errors are in <workdir>/demo/extraction/*.state.jsonl; rerun kitune demo "
        "to retry them (raise lm.extract.timeout_s if they timed out)"
    )


def demo_workdir_config(cfg: KituneConfig) -> KituneConfig:
    """``cfg`` with ``workdir`` moved to ``<workdir>/demo`` (stores, runs and MLflow go there).

    Through :func:`kitune.config.with_overrides`, so settings left unset stay unset (the extraction
    and agent concurrency keep following the embedded server's slots).
    """
    return with_overrides(cfg, {"workdir": Path(cfg.workdir) / "demo"})


def _baseline(env: ServiceLoopEnv, questions: Sequence[Any], path: Path) -> list[Trace]:
    cfg, deps = env.cfg, env.deps
    budget = Budget.from_config(cfg.agent)

    def factory(q: Any) -> Agent:
        box = build_toolbox("baseline", cfg, corpus_store=deps.corpus_store)
        return Agent(deps.chat_model, box, budget=budget, max_output_tokens=cfg.lm.agent.max_tokens)

    return evaluate(
        questions,
        factory,
        skill="baseline",
        concurrency=cfg.concurrency_for("agent"),
        traces_path=path,
        judge=deps.judge,
        progress=env.opts.progress,
    )


def _feedback(env: ServiceLoopEnv, setting: Setting, traces: Sequence[Trace], path: Path) -> FeedbackReport:
    if path.is_file():  # resumable: feedback KIs of an earlier run are in the store already
        data = json.loads(path.read_text(encoding="utf-8"))
        return FeedbackReport(**{**data, "ki_ids": tuple(data.get("ki_ids", ()))})

    failures = collect_failures(traces, env.questions)
    report = write_setting_kis(
        env,
        setting,
        failures,
        cfg=env.setting_cfg(setting),
        lm=env.deps.lms["extract"],
        get_document=env.get_document,
        what="in-context failure(s)",
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"attempted": report.attempted, "written": report.written, "ki_ids": list(report.ki_ids)}
    path.write_text(json.dumps({**data, "rejected": report.rejected}, indent=2), encoding="utf-8")
    return report


def run_demo(
    cfg: KituneConfig,
    opts: DemoOptions,
    *,
    deps: LoopDeps | None = None,
    tracker: Tracker | None = None,
    registry: PromptRegistry | None = None,
    log: Callable[[str], None] = lambda _m: None,
) -> DemoResult:
    """Run the demo (see the module docstring).

    Args:
        cfg: configuration; the demo works under ``<cfg.workdir>/demo``.
        opts: sizes and the optimiser choice.
        deps: models and stores (None: the configured LMs — the embedded local model by default —
            the embedded LanceDB store and a corpus store over the slice).
        tracker: None: MLflow at ``<workdir>/demo/mlflow.db``.
        registry: None: the prompt registry at the same URI.
        log: progress lines.

    Raises:
        DataError: the data folder is missing or too small. ConfigError: bad options.
    """
    dcfg = demo_workdir_config(cfg)
    data = Path(opts.data_dir) if opts.data_dir is not None else default_fixture()
    oopts = OptimizeOptions(
        data_dir=data,
        questions=opts.questions,
        iterations=opts.iterations,
        optimizer=opts.optimizer,
        programs=opts.programs,
        knob_trials=opts.knob_trials,
        max_metric_calls=opts.max_metric_calls,
        budget_minutes=opts.budget_minutes,
        distractors=opts.distractors,
        feedback=False,  # the demo writes feedback KIs itself, once, before the loop
        run_name="demo",
        progress=opts.progress,
    )
    questions, documents = load_slice(dcfg, oopts)
    log(f"slice: {len(questions)} questions, {len(documents)} documents from {data}")
    data_sha256 = dataset_checksum(data).sha256  # recorded in summary.json and the loop's params
    ledger = deps.ledger if deps is not None and deps.ledger is not None else TokenLedger()
    if deps is None:
        corpus = kitune.retrieval.create_corpus_store(dcfg)
        if corpus.count() < len(documents):
            corpus.add_documents(documents)
        deps = optimize_service.default_deps(dcfg, ledger, corpus_store=corpus)
        served = kitune.localmodel.running_local_server()
        if served is not None and served.runtime is not None:
            rates = served.startup_timings or {}
            prompt_tps = float(rates.get("prompt_per_second") or 0)
            gen_tps = float(rates.get("predicted_per_second") or 0)
            log(
                f"local model: {served.runtime.name} ({served.runtime.reason}); ready in "
                f"{served.started_in_s or 0:.1f} s, measured {prompt_tps:.0f} prompt / {gen_tps:.1f} "
                "generated tokens/s"
            )
    if registry is None:
        registry = PromptRegistry(dcfg.mlflow_uri)
    demo_dir = Path(dcfg.workdir)
    state_dir = demo_dir / "optimize" / "demo"
    env = ServiceLoopEnv(
        dcfg, oopts, deps, questions=questions, documents=documents, state_dir=state_dir, log=log
    )
    start = Setting(start_prompts(oopts.programs, corpus=dcfg.corpus_name, registry=registry))
    runs = demo_dir / "runs"
    try:
        log("step 1/5: extract KIs")
        env.ensure_extracted(start, questions)
        extract_failed = env.failed_documents(start)
        extract_retried = env.retried_documents(start)
        log(
            f"extraction: {len(documents) - len(extract_failed)} of {len(documents)} documents extracted, "
            f"{len(extract_failed)} failed, {len(extract_retried)} retried after a timeout"
        )
        if extract_failed:
            log(f"extraction: {failed_documents_line(extract_failed)}")
        log("step 2/5: baseline (search and fetch)")
        baseline = _baseline(env, questions, runs / "baseline.jsonl")
        log("step 3/5: in-context (KIs, no disambiguation)")
        # run files are keyed by the setting: a rerun after a promotion re-evaluates, never reuses
        in_context = env.run_agent(
            start, questions, traces_path=runs / f"in-context-{start.key}.jsonl", disambiguation=False
        )
        log("step 4/5: feedback KIs, then in-context + disambiguation")
        feedback = _feedback(env, start, in_context, demo_dir / f"feedback-{start.key}.json")
        if feedback.written == 0:  # nothing new to see: the arm is the in-context run itself
            log("no feedback KI was written, so in-context + disambiguation is the in-context run")
            disamb = list(in_context)
        else:  # the loop's own store-state-keyed evaluation, so its first iteration reuses it
            disamb = list(env.evaluate(start, "all", label="in-context + disambiguation").traces)
        flips = count_flips(in_context, disamb)
        log(
            f"flips: {len(flips.fixed)} fixed, {len(flips.still_wrong)} still wrong, "
            f"{len(flips.newly_wrong)} newly wrong"
        )
        log(
            f"step 5/5: {opts.iterations} optimisation iteration(s) "
            f"({opts.optimizer} over {', '.join(opts.programs)})"
        )
        loop = run_experiment(
            dcfg,
            env,
            programs=oopts.programs,
            iterations=opts.iterations,
            state_dir=state_dir,
            tracker=tracker,
            registry=registry,
            params={
                "demo": True,
                "questions": len(questions),
                "optimizer": opts.optimizer,
                "data_sha256": data_sha256,
            },
            log=log,
        )
    finally:
        env.close()

    write_fingerprint(state_dir, questions, documents, oopts)
    report = write_report(
        {"baseline": baseline, "in-context": in_context, "in-context + disambiguation": disamb},
        demo_dir / "report",
        data_sha256=data_sha256,
        graders=dict.fromkeys(
            ("baseline", "in-context", "in-context + disambiguation"),
            "judge" if cfg.grading.grader == "llm" else cfg.grading.grader,
        ),
    )
    usage = {f"{r}/{s}": t for (r, s), t in ledger.by_role_stage().items()}
    return DemoResult(
        summaries=report.summaries,
        report=report,
        feedback=feedback,
        flips=flips,
        loop=loop,
        demo_dir=demo_dir,
        mlflow_uri=dcfg.mlflow_uri,
        usage=usage,
        extract_failed=extract_failed,
        extract_retried=extract_retried,
    )
