"""``run_optimize``: the function behind ``kitune optimize`` (and the demo's optimisation round).

This module is the wiring: :func:`default_deps` (the real LMs, agent model, judge and store
factory) and :func:`run_optimize`, which takes :class:`~kitune.service.tuning.options.OptimizeOptions`
(what the command was asked), loads the
slice (:mod:`kitune.service.tuning.slicing`), builds the loop environment
(:class:`~kitune.service.tuning.loop_env.ServiceLoopEnv`: extraction per extractor version, the
store-state-aware evaluation cache, feedback routing) and runs the loop through
:func:`kitune.tracking.runner.run_experiment`. Knob overrides of a setting are applied with
:func:`kitune.config.with_overrides`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import kitune.lm
import kitune.retrieval
from kitune.config import KituneConfig
from kitune.data.checksum import dataset_checksum
from kitune.data.loaders import load_questions
from kitune.errors import ConfigError, PromotionRefusedError, TrackingError
from kitune.optimizers.loop import LoopResult, Setting, start_prompts
from kitune.optimizers.loop_state import read_state
from kitune.optimizers.objective import LoopWeights
from kitune.optimizers.power import measured_sd, power_lines, power_table
from kitune.optimizers.program_task import PROGRAM_TASKS, store_program
from kitune.optimizers.registry import check_optimizer
from kitune.service.pipelines.evaluation import make_judge
from kitune.service.serving.prompts import promote_prompt
from kitune.service.tuning.final_eval import FinalEvaluation, final_evaluation, start_setting
from kitune.service.tuning.loop_env import LoopDeps, ServiceLoopEnv
from kitune.service.tuning.options import OptimizeOptions
from kitune.service.tuning.slice_fingerprint import FINGERPRINT, archive_fingerprint, write_fingerprint
from kitune.service.tuning.slicing import load_slice, write_question_ids
from kitune.tracking.prompts import PromptRegistry, prompt_name
from kitune.tracking.runner import run_experiment
from kitune.usage import TokenLedger

if TYPE_CHECKING:
    from kitune.optimizers.protocols import Tracker
    from kitune.retrieval.base import CorpusStore

__all__ = [
    "ExtractResult",
    "OptimizeResult",
    "default_deps",
    "extract_slice",
    "run_optimize",
    "small_split_notes",
]


def default_deps(
    cfg: KituneConfig, ledger: TokenLedger, *, corpus_store: CorpusStore | None = None
) -> LoopDeps:
    """Real LMs (``build_lm`` per role), the agent chat model, the judge and ``create_store``.

    Raises:
        ConfigError: an LM role cannot be resolved.
    """
    lms = {
        role: kitune.lm.build_lm(cfg, role, ledger=ledger) for role in ("extract", "rewrite", "reflection")
    }
    return LoopDeps(
        lms=lms,
        chat_model=kitune.lm.LiteLLMChatModel(cfg, "agent", ledger=ledger),
        judge=make_judge(cfg, ledger),
        store_factory=lambda c: kitune.retrieval.create_store(c),
        corpus_store=corpus_store,
        ledger=ledger,
    )


@dataclass(frozen=True)
class OptimizeResult:
    """What :func:`run_optimize` returns."""

    loop: LoopResult
    state_dir: Path
    tune_ids: tuple[str, ...]
    validation_ids: tuple[str, ...]
    mlflow_uri: str
    usage: dict[str, dict[str, int]] = field(default_factory=dict)
    final: FinalEvaluation | None = None
    """The start vs final setting on every validation question (``--final-eval``), else None."""
    staged: dict[str, int] = field(default_factory=dict)
    """Prompt name → version this run accepted, staged as ``candidate`` (not served until promoted)."""
    promoted: dict[str, int] = field(default_factory=dict)
    """Prompt name → version promoted to ``production`` at the end (``OptimizeOptions.promote``)."""
    promotion_refused: str = ""
    """Why the end-of-run promotion was refused (empty: not asked or done)."""


def _log_power(
    cfg: KituneConfig, opts: OptimizeOptions, env: ServiceLoopEnv, state_dir: Path, log: Callable[[str], None]
) -> None:
    """Print the minimum detectable effect of each decision before the run (the stage rule only)."""
    o = cfg.optimize
    if o.decision_rule != "stage":
        log("decision rule: permissive (any paired end-to-end gain is accepted; no test, no power)")
        return
    n_val = len(env.validation)
    n_e2e = n_val if opts.measure != "stage" else env.e2e_sample_size(n_val)
    rows = power_table(
        n_validation=n_val,
        programs=opts.programs,
        alpha=o.alpha,
        power=o.power,
        noninferiority_margin=o.noninferiority_margin,
        knobs=opts.knob_trials > 0,
        measured=measured_sd(state_dir),
        n_end_to_end=n_e2e,
    )
    for line in power_lines(rows, alpha=o.alpha, power=o.power, margin=o.noninferiority_margin):
        log(line)


def small_split_notes(n_tune: int, n_validation: int, decision_rule: str, opts: OptimizeOptions) -> list[str]:
    """The steps a split too small skips, each naming the step, the count and the fix.

    A run goes on with any question count ≥ 1 (one question goes to tuning): what it cannot do
    on an empty split is said before it starts, not failed on.

    Args:
        n_tune: tuning questions (≥ 0).
        n_validation: validation questions (≥ 0).
        decision_rule: ``optimize.decision_rule`` (``stage`` or ``permissive``).
        opts: the run's options (``final_eval``, ``questions``).

    Returns:
        One line per skipped step (empty: the split serves every step).
    """
    n = n_tune + n_validation
    fix = "use --questions 2 or more (a data set with at least 2 questions) for a validation split"
    notes: list[str] = []
    if n_validation == 0:
        kept = "kept out as 'not enough evidence'" if decision_rule == "stage" else "rejected"
        notes.append(
            f"skipped the validation decision: 0 validation questions ({n} question(s), all tuning), so "
            f"every proposal is {kept} and nothing is staged; {fix}"
        )
        if opts.final_eval:
            notes.append(f"skipped the final evaluation (--final-eval): 0 validation questions; {fix}")
    if n_tune == 0:
        notes.append(
            f"skipped the improve step: 0 tuning questions ({n} question(s), all validation): nothing to "
            "optimise on; use more questions or --split random"
        )
    return notes


def run_optimize(
    cfg: KituneConfig,
    opts: OptimizeOptions,
    *,
    deps: LoopDeps | None = None,
    tracker: Tracker | None = None,
    registry: PromptRegistry | None = None,
    log: Callable[[str], None] = lambda _m: None,
) -> OptimizeResult:
    """Run (or resume) the optimisation loop on a dataset slice.

    Raises:
        ConfigError: unknown programs/optimizer. DataError: bad data. TrackingError: the registry
        cannot be written.
    """
    PROGRAM_TASKS.check(opts.programs)
    check_optimizer(opts.optimizer)
    questions, documents = load_slice(cfg, opts)
    ledger = deps.ledger if deps is not None and deps.ledger is not None else TokenLedger()
    if deps is None:
        corpus = kitune.retrieval.create_corpus_store(cfg)
        if corpus.count() < len(documents):
            corpus.add_documents(documents)
        deps = default_deps(cfg, ledger, corpus_store=corpus)
    state_dir = Path(cfg.workdir) / "optimize" / opts.run_name
    env = ServiceLoopEnv(
        cfg, opts, deps, questions=questions, documents=documents, state_dir=state_dir, log=log
    )
    _record_questions(cfg, opts, env)
    for line in small_split_notes(len(env.tune), len(env.validation), cfg.optimize.decision_rule, opts):
        log(f"[yellow]{line}[/]")
    _log_power(cfg, opts, env, state_dir, log)
    try:
        loop = run_experiment(
            cfg,
            env,
            programs=opts.programs,
            iterations=opts.iterations,
            state_dir=state_dir,
            tracker=tracker,
            registry=registry,
            params={
                "optimizer": opts.optimizer,
                "programs": ",".join(opts.programs),
                "questions": len(questions),
                "data": str(Path(opts.data_dir).resolve()),
                "data_sha256": dataset_checksum(opts.data_dir).sha256,
                "knob_trials": opts.knob_trials,
                "sample_seed": "first" if opts.sample_seed is None else opts.sample_seed,
                "max_pareto_examples": cfg.optimize.max_pareto_examples,
                "gate": cfg.optimize.gate,
                "max_metric_calls": opts.max_metric_calls or cfg.optimize.max_metric_calls or "auto",
                "min_proposals": cfg.optimize.min_proposals,
                "split": opts.split,
                "measure": opts.measure,
                "tune_agent": opts.tune_agent,
                "e2e_sample": opts.e2e_sample,
            },
            log=log,
            promote=False,  # staged; promoted below through the checked promotion when asked
        )
        final = _final(cfg, env, loop) if opts.final_eval else None
    finally:
        env.close()
        # a run that ended (or stopped) with a kept or accepted version has a state drift reads
        if (state_dir / "loop_state.json").is_file():
            write_fingerprint(state_dir, questions, documents, opts)

    staged = _staged_versions(cfg, loop)
    extractor_name = prompt_name(cfg.corpus_name, store_program())
    if extractor_name in staged and (state_dir / FINGERPRINT).is_file():  # promote puts it in place
        archive_fingerprint(state_dir, extractor_name, staged[extractor_name])
    promoted: dict[str, int] = {}
    refused = ""
    if staged:
        log("staged (alias candidate, not served): " + ", ".join(f"{n} v{v}" for n, v in staged.items()))
    if opts.promote and staged:
        try:
            for name, version in staged.items():
                promoted[name] = promote_prompt(cfg, name, version).version
        except PromotionRefusedError as e:
            refused = str(e)
    usage = {f"{r}/{s}": t for (r, s), t in ledger.by_role_stage().items()}
    return OptimizeResult(
        loop=loop,
        state_dir=state_dir,
        tune_ids=tuple(q.query_id for q in env.tune),
        validation_ids=tuple(q.query_id for q in env.validation),
        mlflow_uri=cfg.mlflow_uri,
        usage=usage,
        staged=staged,
        promoted=promoted,
        promotion_refused=refused,
        final=final,
    )


def _final(cfg: KituneConfig, env: ServiceLoopEnv, loop: LoopResult) -> FinalEvaluation | None:
    """``--final-eval``: the start setting against the final one on every validation question."""
    start = start_setting(env.state_dir)
    if start is None:
        env.log("[yellow]final evaluation skipped: the run has no finished iteration[/]")
        return None
    if not env.validation:  # said before the run (small_split_notes)
        return None
    env.log(f"final evaluation: start {start.key} vs final {loop.setting.key} on every validation question")
    return final_evaluation(
        env, start, loop.setting, weights=LoopWeights.from_config(cfg), seed=cfg.optimize.seed
    )


def _staged_versions(cfg: KituneConfig, loop: LoopResult) -> dict[str, int]:
    """Prompt name → the latest version the loop registered for it (accepted, alias ``candidate``)."""
    out: dict[str, int] = {}
    for record in loop.history:
        for program, version in record.registered.items():
            out[prompt_name(cfg.corpus_name, program)] = int(version)
    return out


def _record_questions(cfg: KituneConfig, opts: OptimizeOptions, env: ServiceLoopEnv) -> Path:
    """``<state>/questions.json``: the run's questions (sample seed, tune and validation ids).

    A run that has finished an iteration keeps its split: when the options now give other tuning
    or validation questions (another ``--split``, ``--questions``, ``--sample-seed`` or
    ``optimize.seed``), nothing is rewritten and the run refuses to resume (the environment is
    closed first).

    Raises:
        ConfigError: the split differs from the one a finished iteration used.
    """
    path = env.state_dir / "questions.json"
    history, _, _ = read_state(env.state_dir / "loop_state.json")
    if history and path.is_file():
        old = json.loads(path.read_text(encoding="utf-8"))
        new_tune, new_val = [q.query_id for q in env.tune], [q.query_id for q in env.validation]
        if (old.get("tune"), old.get("validation")) != (new_tune, new_val):
            env.close()
            was = (old.get("split") or {}).get("method", "random")
            raise ConfigError(
                f"run {opts.run_name!r} finished {len(history)} iteration(s) on another split ({was}, "
                f"{len(old.get('tune', []))} tuning / {len(old.get('validation', []))} validation "
                f"questions, {path}); now --split {opts.split} gives {len(new_tune)} / {len(new_val)} "
                "other ones: pass the options it started with (--split, --questions, --sample-seed, "
                "optimize.seed) or a new --run-name"
            )
    return write_question_ids(
        env.state_dir,
        data_dir=opts.data_dir,
        n_total=len(load_questions(Path(opts.data_dir))),
        sample_seed=opts.sample_seed,
        tune=env.tune,
        validation=env.validation,
        split_seed=cfg.optimize.seed,
        split=env.split,
    )


@dataclass(frozen=True)
class ExtractResult:
    """What :func:`extract_slice` returns."""

    state_dir: Path
    setting_key: str
    """The start setting whose extractor was used."""
    prompt_version: str
    """``extractor@<sha8>``: names the KI table (``<store table>-<sha8>``)."""
    documents: int
    metrics: dict[str, float]
    """``extract_*`` counts of this call (empty: every document was done already)."""
    tune_ids: tuple[str, ...]
    validation_ids: tuple[str, ...]


def extract_slice(
    cfg: KituneConfig,
    opts: OptimizeOptions,
    *,
    deps: LoopDeps | None = None,
    registry: PromptRegistry | None = None,
    log: Callable[[str], None] = lambda _m: None,
) -> ExtractResult:
    """Extract every document of the loop's slice with the extractor the loop starts from, and stop.

    ``kitune optimize --extract-only``: the same environment, state folder and store table as the
    loop (a saved loop state's setting, else the registry's ``production`` prompts, else the
    packaged ones), so the loop later finds every document extracted; resumable (documents done
    are skipped) and filling the extraction cache GEPA's extractor task reads. Also writes
    ``questions.json``.

    Raises:
        ConfigError: unknown programs. DataError: bad data.
    """
    PROGRAM_TASKS.check(opts.programs)
    questions, documents = load_slice(cfg, opts)
    ledger = deps.ledger if deps is not None and deps.ledger is not None else TokenLedger()
    if deps is None:
        deps = default_deps(cfg, ledger)
    state_dir = Path(cfg.workdir) / "optimize" / opts.run_name
    env = ServiceLoopEnv(
        cfg, opts, deps, questions=questions, documents=documents, state_dir=state_dir, log=log
    )
    _record_questions(cfg, opts, env)
    _, saved, _ = read_state(state_dir / "loop_state.json")
    if saved is None and registry is None:
        try:
            registry = PromptRegistry(cfg.mlflow_uri)
        except TrackingError as e:
            log(f"[yellow]prompt registry unavailable ({e}); extracting with the packaged extractor[/]")
    setting = saved or Setting(start_prompts(opts.programs, corpus=cfg.corpus_name, registry=registry))
    try:
        metrics = env.ensure_extracted(setting, questions)
        version = env.extractor(setting).prompt_version
    finally:
        env.close()
    return ExtractResult(
        state_dir=state_dir,
        setting_key=setting.key,
        prompt_version=version,
        documents=len(documents),
        metrics=metrics,
        tune_ids=tuple(q.query_id for q in env.tune),
        validation_ids=tuple(q.query_id for q in env.validation),
    )
