"""The three improvements of one loop iteration, as functions of a :class:`ServiceLoopEnv`.

* :func:`optimize_program` — the configured optimiser on one program's task (one file each in
  :mod:`kitune.optimizers.programs`): the extractor on its tuning questions' gold documents, the
  rewriter through whole agent episodes, the disambiguator on the tuning failures;
* :func:`tune_knobs` — Optuna over the retrieval knobs with the LLM-free
  :func:`knob_objective` (answer-bearing recall of ``get_context`` on the tuning questions), the
  study on disk at ``<state>/knobs.journal`` so it resumes;
* :func:`write_feedback` — disambiguation KIs from the failures (:func:`write_setting_kis`, which
  the demo's feedback step uses too), then the flips they cause on the tuning questions.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import httpx

from kitune.config import KituneConfig
from kitune.errors import ConfigError
from kitune.optimizers.budget import OptimizerBudget
from kitune.optimizers.feedback import FeedbackReport, count_flips, write_disambiguation_kis
from kitune.optimizers.improve_env import ImproveInput
from kitune.optimizers.loop import Evaluation, Setting
from kitune.optimizers.objective import text_contains_answer
from kitune.optimizers.program_task import get_program_task
from kitune.optimizers.registry import make_optimizer

if TYPE_CHECKING:
    from kitune.optimizers.ledger import FailureLedger
    from kitune.service.optimize import ServiceLoopEnv

__all__ = [
    "RETRIEVAL_KNOBS",
    "knob_objective",
    "make_program_optimizer",
    "optimize_program",
    "optimizer_budget",
    "reflection_context_tokens",
    "reflection_fallback",
    "server_context_window",
    "tune_knobs",
    "write_feedback",
    "write_setting_kis",
]

RETRIEVAL_KNOBS = (
    "retrieval.branch_size",
    "retrieval.rrf_k",
    "retrieval.tag_weight",
    "retrieval.lexical_weight",
    "retrieval.semantic_weight",
    "retrieval.confidence_floor",
)
"""Knobs the LLM-free objective can measure (no re-extraction or agent run needed)."""


def optimizer_budget(env: ServiceLoopEnv) -> OptimizerBudget:
    """The loop's :class:`~kitune.optimizers.budget.OptimizerBudget`, from the options and the config.

    ``max_metric_calls`` from the command (``--max-metric-calls``), else
    ``optimize.max_metric_calls`` (both unset: sized by the optimiser to ``optimize.min_proposals``
    proposals); ``minutes`` from ``--budget-minutes``; ``threads`` =
    ``cfg.concurrency_for("optimizer")`` (parallel metric calls: the embedded server's slots, or
    ``agent.concurrency`` when set); the reflection window (:func:`reflection_context_tokens`,
    asked once per environment) and reply cap (``lm.reflection.max_tokens``).
    """
    o = env.cfg.optimize
    return OptimizerBudget(
        max_metric_calls=env.opts.max_metric_calls
        if env.opts.max_metric_calls is not None
        else o.max_metric_calls,
        minutes=env.opts.budget_minutes,
        threads=env.cfg.concurrency_for("optimizer"),
        min_proposals=o.min_proposals,
        reflection_context_tokens=env.reflection_window(),
        reflection_max_tokens=env.cfg.lm.reflection.max_tokens,
    )


def make_program_optimizer(env: ServiceLoopEnv, metric: Callable[..., Any]) -> Any:
    """The optimiser the options name (from the registry), seeded from the environment's RNG."""
    return make_optimizer(
        env.opts.optimizer,
        metric,
        reflection_lm=env.deps.lms["reflection"],
        budget=optimizer_budget(env),
        rng=random.Random(env.rng.randrange(2**31)),
    )


def reflection_context_tokens(cfg: KituneConfig, *, client: httpx.Client | None = None) -> int | None:
    """The reflection model's context window in tokens, or None when nothing reports it (then no sizing).

    In order: ``optimize.reflection_context_tokens`` when set; ``lm.local.n_ctx`` for the embedded
    model (each llama-server slot gets that many tokens); LiteLLM's model table
    (``max_input_tokens``); else what the server itself reports (:func:`server_context_window`:
    llama-server's ``/props``, vLLM's or llama-server's ``/models``). With ``lm.replay_dir`` set
    the server is not asked (a replay contacts nothing).

    Args:
        cfg: the configuration.
        client: the HTTP client for the server probe (tests pass one with a mock transport).
    """
    explicit = cfg.optimize.reflection_context_tokens
    if explicit is not None:
        return int(explicit)
    if cfg.uses_local_model("reflection"):
        return int(cfg.lm.local.n_ctx)
    model = cfg.lm.reflection.model or cfg.lm.gateway.default_model
    if not model:
        return None
    try:
        import litellm

        info = litellm.get_model_info(model)
        window = info.get("max_input_tokens") or info.get("max_tokens")
        if window:
            return int(window)
    except Exception:  # not in LiteLLM's table: ask the server
        pass
    if cfg.lm.replay_dir is not None:
        return None
    from kitune.lm import resolve_role

    try:
        base = resolve_role(cfg, "reflection").api_base
    except ConfigError:
        return None
    return server_context_window(base, client=client) if base else None


def server_context_window(
    base_url: str, *, client: httpx.Client | None = None, timeout_s: float = 5.0
) -> int | None:
    """The per-request context window an OpenAI-compatible server reports, or None.

    Asks ``<root>/props`` (llama-server: ``default_generation_settings.n_ctx``, the per-slot
    window) and then ``<base>/models`` (vLLM: ``max_model_len``; llama-server:
    ``meta.n_ctx_train``). Any failure (no such path, not JSON, unreachable) reads as unknown.

    Args:
        base_url: the role's base URL, e.g. ``http://127.0.0.1:8080/v1``.
        client: an ``httpx.Client`` (default: a new one with ``timeout_s``).
        timeout_s: per request.

    Returns:
        Tokens, ≥ 1, or None.
    """
    base = base_url.rstrip("/")
    root = base[: -len("/v1")] if base.endswith("/v1") else base
    http = client or httpx.Client(timeout=timeout_s)
    try:
        for url, read in ((f"{root}/props", _props_window), (f"{base}/models", _models_window)):
            try:
                resp = http.get(url)
                if resp.status_code == 200:
                    window = read(resp.json())
                    if window:
                        return window
            except (httpx.HTTPError, ValueError):
                continue
        return None
    finally:
        if client is None:
            http.close()


def _positive(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and value >= 1 else None


def _props_window(body: Any) -> int | None:
    if not isinstance(body, dict):
        return None
    settings = body.get("default_generation_settings")
    if isinstance(settings, dict) and _positive(settings.get("n_ctx")):
        return _positive(settings.get("n_ctx"))
    return _positive(body.get("n_ctx"))


def _models_window(body: Any) -> int | None:
    data = body.get("data") if isinstance(body, dict) else None
    for entry in data if isinstance(data, list) else []:
        if not isinstance(entry, dict):
            continue
        meta = entry.get("meta")
        window = _positive(entry.get("max_model_len")) or (
            _positive(meta.get("n_ctx_train")) if isinstance(meta, dict) else None
        )
        if window:
            return window
    return None


def reflection_fallback(cfg: KituneConfig) -> str | None:
    """The warning when no reflection model is configured, else None.

    Without ``lm.reflection.model`` the ``reflection`` role resolves like every other role (the
    gateway's ``default_model``, else the embedded model), so the optimisers reflect with the
    model the tasks run on. That is a documented fallback, not an error (the embedded set-up has
    one model): the loop logs this warning once and notes it in every iteration's ``improve.json``.
    """
    if cfg.lm.reflection.model is not None:
        return None
    label = cfg.lm.model_label("reflection")
    same = [r for r in ("extract", "rewrite") if cfg.lm.model_label(r) == label]
    shared = f", the same model as the {' and '.join(same)} task(s)" if same else ""
    return (
        f"no reflection model configured (lm.reflection.model): the optimisers reflect with {label}{shared}; "
        "set lm.reflection.model to a stronger model for better proposals"
    )


def optimize_program(env: ServiceLoopEnv, program: str, inp: ImproveInput) -> Any:
    """Run the optimiser on one program's task (``optimizers/programs/``); None without examples.

    The task builds the module, the examples and the stage metric from the iteration's input (the
    tuning run, its failures and failure kinds); with 4 or more examples the first half proposes
    and the second half scores, else all of them do both (the loop's own validation split guards
    over-fitting). The module runs on the task's LM role.

    Raises:
        ConfigError: unknown program, or the optimiser refused its metric, LM or budget.
        OptimizationError: the optimiser failed.
    """
    import dspy

    task = get_program_task(program)
    env.log(f"optimise {program} with {env.opts.optimizer} (iteration {inp.iteration})")
    setup = task.setup(env, inp)
    if setup is None or not setup.examples:
        env.log(f"{program}: no examples this iteration, skipped")
        return None
    examples = list(setup.examples)
    half = len(examples) // 2
    train, val = (examples[:half], examples[half:]) if len(examples) >= 4 else (examples, examples)
    with dspy.context(lm=env.deps.lms[task.lm_role]):
        return make_program_optimizer(env, setup.metric).compile(setup.module, trainset=train, valset=val)


def knob_objective(env: ServiceLoopEnv, setting: Setting) -> Callable[[dict[str, int | float]], float]:
    """LLM-free knob objective: share of tuning questions whose top KIs (plain plan) state the answer."""
    from kitune.config import RetrievalConfig, with_overrides
    from kitune.service.context import get_context

    store = env.store_for(setting)
    base = env.setting_cfg(setting)

    def objective(params: dict[str, int | float]) -> float:
        cfg = with_overrides(base, params)
        with env.lock:
            old = getattr(store, "retrieval", None)
            if old is not None:
                store.retrieval = RetrievalConfig.model_validate(cfg.retrieval.model_dump())  # type: ignore[attr-defined]
            try:
                hits = 0
                for q in env.tune:
                    resp = get_context(q.query, store=store, size=cfg.retrieval.default_size, cfg=cfg)
                    hits += any(text_contains_answer(f"{k.title} {k.description}", q.golds) for k in resp.kis)
            finally:
                if old is not None:
                    store.retrieval = old  # type: ignore[attr-defined]
        return hits / len(env.tune) if env.tune else 0.0

    return objective


def tune_knobs(
    env: ServiceLoopEnv, setting: Setting, iteration: int, notes: dict[str, Any], metrics: dict[str, float]
) -> dict[str, int | float]:
    """Run the Optuna study (on disk, resumes) and return knob overrides if they beat the current ones."""
    from kitune.optimizers.knobs import DEFAULT_KNOBS, KnobSpace, KnobStudy

    space = KnobSpace(tuple(k for k in DEFAULT_KNOBS if k.key in RETRIEVAL_KNOBS))
    objective = knob_objective(env, setting)
    current = {k: v for k, v in space.current(env.setting_cfg(setting)).items()}
    baseline = objective(dict(current))
    study = KnobStudy(
        env.state_dir / "knobs.journal",
        f"{env.opts.run_name}-{setting.key}",
        space=space,
        seed=env.cfg.optimize.seed,
    )
    if not study.trials():
        study.enqueue(current)
    done = study.optimize(objective, env.opts.knob_trials)
    best = study.best()
    metrics.update(
        {
            "knob_trials": float(len(done)),
            "knob_baseline": baseline,
            "knob_best": float(best.value or 0.0),
        }
    )
    notes["knob_best_params"] = dict(best.params)
    if best.value is not None and best.value > baseline:
        return dict(best.params)
    return {}


def write_setting_kis(
    env: ServiceLoopEnv, setting: Setting, failures: Sequence[Any], *, what: str = "failure(s)"
) -> FeedbackReport:
    """Write disambiguation KIs from ``failures`` into the setting's store.

    The setting's disambiguator prompt writes them; the extract LM answers; candidates come from
    the setting's ``get_context`` at its default size.

    Args:
        env: the loop's environment (store, documents, LMs, log).
        setting: whose store, knobs and disambiguator prompt are used.
        failures: the wrong answers to write KIs for.
        what: how the progress line names the failures.

    Returns:
        What :func:`~kitune.optimizers.feedback.write_disambiguation_kis` did.
    """
    from kitune.programs.disambiguator import Disambiguator
    from kitune.service.context import context_ids

    store = env.store_for(setting)
    cfg = env.setting_cfg(setting)
    env.log(f"feedback: {len(failures)} {what} → disambiguation KIs")
    return write_disambiguation_kis(
        failures,
        store=store,
        disambiguator=Disambiguator(setting.prompts.get("disambiguator"), corpus=cfg.corpus_name),
        get_document=env.get_document,
        context_fn=context_ids(store=store, cfg=cfg, size=cfg.retrieval.default_size),
        lm=env.deps.lms["extract"],
        top_k=cfg.retrieval.default_size,
    )


def write_feedback(
    env: ServiceLoopEnv,
    setting: Setting,
    tune: Evaluation,
    failures: Sequence[Any],
    iteration: int,
    *,
    ledger: FailureLedger | None = None,
    notes: dict[str, Any] | None = None,
) -> dict[str, float]:
    """Write disambiguation KIs from ``failures``, note them in the ledger, count tuning flips.

    The flips are measured by evaluating the setting on the tuning split again: the store has
    changed, so only the questions whose look-ups now return something different re-run, and
    the next iteration reuses these traces.
    """
    report = write_setting_kis(env, setting, failures)
    if ledger is not None:
        for qid, prediction, ki_id, reason in report.outcomes:
            ledger.note_feedback(iteration, qid, prediction, [ki_id] if ki_id else [], reason)
    metrics = report.to_metrics()
    if notes is not None and report.messages:
        notes["feedback_rejections"] = dict(report.messages)  # the first full message per reason
    if report.written:
        after = env.evaluate(setting, "tune")
        metrics.update(count_flips(tune.traces, after.traces).to_metrics())
    return metrics
