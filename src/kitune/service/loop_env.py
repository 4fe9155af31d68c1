"""The loop environment :class:`ServiceLoopEnv`: the real :class:`kitune.optimizers.loop.LoopEnv`.

What it does per loop step:

* **extract only what changed** — KIs live in one store table per extractor prompt version
  (``<table>-<sha8>``) with a resume file per version
  (:func:`kitune.service.extraction.default_state_path`), so a setting's extraction only
  touches documents without KIs for its extractor version; disambiguation KIs are copied into a
  new version's table so feedback is never lost;
* **evaluate** — the in-context agent (disambiguation KIs visible, the query rewriter with the
  setting's instruction when ``rewriter`` is tuned) on the questions of a split. The cache key
  is the setting *and the KI store's state*
  (:func:`~kitune.service.eval_cache.store_fingerprint`): traces go to
  ``<state>/evals/<setting eval key>-<store fingerprint>.jsonl`` (the eval key leaves out the
  disambiguator's instruction, which changes what is written, not what is read) and every
  ``get_context`` call the agent made is logged (query, SHA-256 of the observation text, KI ids shown) to
  ``<state>/evals/observations.jsonl``. When the store has changed since a question's last trace
  for this setting, its look-ups are replayed against the store as it is now: if every
  observation is identical, the agent (deterministic at temperature 0) would see exactly what it
  saw before, so the trace is reused; otherwise the question is run again. A rerun, or another
  split of the same setting on the same store, reuses finished questions
  (:class:`~kitune.service.eval_cache.EvalCache`);
* **improve** — (a) prompt optimisation (GEPA or MIPROv2) of each selected program (the
  extractor with feedback on what the agent did with each gold document's KIs, the gold
  documents of no-candidate failures first), (b) Optuna knobs with an LLM-free objective
  (answer-bearing recall of the KIs ``get_context`` returns for the tuning questions, plain
  plans), its study on disk at ``<state>/knobs.journal``, and (c) feedback KIs, routed by
  failure kind: wrong-entity and wrong-number failures go to the disambiguator unless the
  failure ledger says the question already had ``optimize.max_feedback_attempts`` attempts or
  one for the same wrong answer (the three live in :mod:`kitune.service.improve`).

Every dependency (LMs, agent model, judge, store factory, corpus store) can be injected through
:class:`LoopDeps`, so the whole loop runs in tests with scripted models
(:func:`kitune.service.optimize.default_deps` builds the real ones).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kitune.config import KituneConfig, with_overrides
from kitune.data.examples import split_questions
from kitune.data.loaders import Question
from kitune.errors import DocumentNotFoundError, OptimizationError
from kitune.evaluation.failures import classify_failure
from kitune.evaluation.report import summarize
from kitune.optimizers.feedback import collect_failures
from kitune.optimizers.ledger import FailureLedger
from kitune.optimizers.loop import Evaluation, Proposal, Setting
from kitune.optimizers.objective import answer_coverage
from kitune.schema import Document, Filter
from kitune.service.eval_cache import EvalCache, lookup_record, store_fingerprint
from kitune.service.prompts import versioned_store_cfg

if TYPE_CHECKING:
    from kitune.chat import ChatModel
    from kitune.evaluation.metrics import JudgeFn, Trace
    from kitune.ki import KI
    from kitune.retrieval.base import CorpusStore, Store
    from kitune.service.optimize import OptimizeOptions
    from kitune.usage import TokenLedger

__all__ = [
    "DISAMBIGUATION_KINDS",
    "LoopDeps",
    "ServiceLoopEnv",
    "route_feedback",
]

_PREDICTOR = {"extractor": "extract", "rewriter": "rewriter.planner", "disambiguator": "program.writer"}
"""Program → the predictor name its optimisation task exposes."""

DISAMBIGUATION_KINDS = ("wrong_entity", "wrong_number")
"""Failure kinds the feedback step turns into disambiguation KIs."""


@dataclass
class LoopDeps:
    """Everything the environment calls out to (inject stand-ins in tests)."""

    lms: Mapping[str, Any]
    """Role → ``dspy.LM`` for ``extract``, ``rewrite`` and ``reflection`` (the disambiguator
    uses ``extract``)."""
    chat_model: ChatModel
    """The agent model."""
    judge: JudgeFn | None
    """The grader (None: exact match decides)."""
    store_factory: Callable[[KituneConfig], Store]
    """Opens the KI store ``cfg.store`` names."""
    corpus_store: CorpusStore | None = None
    """Raw-search fallback for the in-context skill and the baseline."""
    ledger: TokenLedger | None = None


class ServiceLoopEnv:
    """The real loop environment (see the module docstring).

    Args:
        cfg: configuration (knob overrides of a setting are applied on top).
        opts: the command's options.
        deps: LMs, models, stores.
        questions: the selected questions (split into tune/validation with ``cfg.optimize``).
        documents: evidence documents of the questions plus distractors (all get extracted).
        state_dir: ``<workdir>/optimize/<run name>``.
        log: progress lines go here (e.g. ``console.print``).
    """

    def __init__(
        self,
        cfg: KituneConfig,
        opts: OptimizeOptions,
        deps: LoopDeps,
        *,
        questions: Sequence[Question],
        documents: Sequence[Document],
        state_dir: Path,
        log: Callable[[str], None] = lambda _m: None,
    ) -> None:
        self.cfg = cfg
        self.opts = opts
        self.deps = deps
        self.questions = list(questions)
        self.documents = {d.docid: d for d in documents}
        self.state_dir = state_dir
        self.log = log
        self.tune, self.validation = split_questions(
            self.questions, validation_fraction=cfg.optimize.validation_fraction, seed=cfg.optimize.seed
        )
        self._stores: dict[str, Store] = {}
        self._extracted: set[tuple[str, frozenset[str]]] = set()
        self._failed: dict[str, set[str]] = {}
        """Extractor version → documents that failed in this process (retried by the next run only)."""
        self.lock = threading.RLock()
        self.evals = EvalCache(state_dir / "evals", self.lock)
        """Traces and look-up log of every evaluation, keyed by setting and store state."""
        self.rng = random.Random(cfg.optimize.seed)

    # -- helpers ------------------------------------------------------------------------------
    def get_document(self, docid: str) -> Document:
        """A document of the slice. Raises DocumentNotFoundError for others."""
        if docid not in self.documents:
            raise DocumentNotFoundError(docid)
        return self.documents[docid]

    def questions_for(self, split: str) -> list[Question]:
        """``tune``, ``validation`` or ``all`` questions."""
        if split == "tune":
            return list(self.tune)
        if split == "validation":
            return list(self.validation)
        return list(self.questions)

    def setting_cfg(self, setting: Setting) -> KituneConfig:
        """``cfg`` with the setting's knobs applied."""
        return with_overrides(self.cfg, setting.knobs)

    def extractor(self, setting: Setting) -> Any:
        """A ``FactExtractor`` with the setting's instruction and limits."""
        from kitune.programs.fact_extractor import FactExtractor

        return FactExtractor.from_config(self.setting_cfg(setting), setting.prompts.get("extractor"))

    def store_for(self, setting: Setting) -> Store:
        """The KI store of the setting's extractor version (opened once, disambiguation KIs carried over)."""
        version = self.extractor(setting).prompt_version
        with self.lock:
            if version in self._stores:
                return self._stores[version]
            store = self.deps.store_factory(versioned_store_cfg(self.setting_cfg(setting), version))
            carried: dict[str, KI] = {}
            for other in self._stores.values():
                for ki in other.iter_kis(Filter(statuses=(), subtypes=("disambiguation",))):
                    carried[ki.id] = ki
            if carried:
                store.upsert(list(carried.values()))
            self._stores[version] = store
            return store

    def rewriter(self, setting: Setting) -> Any:
        """The query rewriter with the setting's instruction, or None when ``rewriter`` is not tuned."""
        if "rewriter" not in self.opts.programs or "rewriter" not in setting.prompts:
            return None
        from kitune.lm import KituneLM, adapter_for
        from kitune.programs.query_rewriter import QueryRewriter

        lm = self.deps.lms["rewrite"]
        adapter = adapter_for(lm) if isinstance(lm, KituneLM) else None
        rw = QueryRewriter(setting.prompts["rewriter"], adapter=adapter)
        rw.set_lm(lm)
        return rw

    def context_fn(self, setting: Setting, rewriter: Any = None, *, disambiguation: bool = True) -> Any:
        """The agent's ``get_context`` tool for ``setting`` (rewriter None: the setting's own)."""
        from kitune.service.evaluation import make_context_fn

        rw = rewriter if rewriter is not None else self.rewriter(setting)
        return make_context_fn(
            self.setting_cfg(setting),
            self.store_for(setting),
            disambiguation=disambiguation,
            ledger=self.deps.ledger,
            rewriter=rw,
        )

    def ensure_extracted(self, setting: Setting, questions: Sequence[Question]) -> dict[str, float]:
        """Extract the documents ``questions`` need (plus distractors) not yet done for this version.

        A document that fails is not retried within this process (a rerun retries it), so a
        document the model cannot handle costs one attempt per run, not one per evaluation.

        Returns:
            Extraction metrics (``extract_*``) of this call; ``{}`` when nothing was extracted.
        """
        import dspy

        from kitune.service.extraction import default_state_path, extract_corpus, read_state

        extractor = self.extractor(setting)
        wanted = {d for q in questions for d in (*q.evidence_docids, *q.gold_docids)}
        evidence = {d for q in self.questions for d in (*q.evidence_docids, *q.gold_docids)}
        # the split's own documents plus every distractor (documents no selected question needs)
        failed_here = self._failed.setdefault(extractor.prompt_version, set())
        docs = [
            d
            for i, d in self.documents.items()
            if (i in wanted or i not in evidence) and i not in failed_here  # one try per process
        ]
        key = (extractor.prompt_version, frozenset(d.docid for d in docs))
        if key in self._extracted:
            return {}
        cfg = self.setting_cfg(setting)
        store = self.store_for(setting)
        state_path = default_state_path(cfg, extractor.prompt_version)
        done = read_state(state_path)
        todo = sum(done.get(d.docid) != "ok" for d in docs)
        if todo:
            self.log(f"extract {todo} of {len(docs)} documents with {extractor.prompt_version}")
        with dspy.context(lm=self.deps.lms["extract"]):
            report = extract_corpus(
                docs,
                store,
                extractor,
                cfg=cfg,
                ledger=self.deps.ledger,
                state_path=state_path,
                progress=self.opts.progress,
            )
        self._extracted.add(key)
        failed_here.update(report.failed)
        metrics = {
            "extract_docs_done": float(report.docs_done),
            "extract_docs_failed": float(report.docs_failed),
            "extract_docs_skipped": float(report.docs_skipped),
            "extract_kis_written": float(report.kis_written),
            "extract_facts_dropped": float(sum(report.drops.values())),
            "extract_parse_failures": float(report.parse_failures),
        }
        metrics.update({f"extract_dropped_{k}": float(v) for k, v in report.drops.items()})
        return metrics

    def kis_by_doc(self, setting: Setting) -> dict[str, list[KI]]:
        """Extracted (non-disambiguation) KIs of the setting's store, by evidence document."""
        out: dict[str, list[KI]] = {}
        for ki in self.store_for(setting).iter_kis():
            if ki.payload.subtype == "disambiguation":
                continue
            for d in ki.evidence_doc_ids:
                out.setdefault(d, []).append(ki)
        return out

    def run_agent(
        self,
        setting: Setting,
        questions: Sequence[Question],
        *,
        traces_path: Path,
        disambiguation: bool = True,
        store_state: str | None = None,
    ) -> list[Trace]:
        """Run the in-context agent on ``questions`` (resuming from ``traces_path``).

        Every ``get_context`` call is logged to ``evals/observations.jsonl`` with the setting
        key and ``store_state`` (see the module docstring).
        """
        from kitune.evaluation.agent import Agent
        from kitune.evaluation.budget import Budget
        from kitune.evaluation.harness import evaluate
        from kitune.evaluation.tools import build_toolbox

        cfg = self.setting_cfg(setting)
        context_fn = self.context_fn(setting, disambiguation=disambiguation)
        budget = Budget.from_config(cfg.agent)
        model = self.deps.chat_model
        calls: dict[str, list[dict[str, Any]]] = {}
        state = store_state if store_state is not None else store_fingerprint(self.store_for(setting))

        def factory(q: Question) -> Agent:
            log = calls.setdefault(q.query_id, [])
            log.clear()

            def recorded(query: str) -> Any:
                obs = context_fn(query)
                log.append(lookup_record(query, obs.text))
                return obs

            box = build_toolbox("in-context", cfg, corpus_store=self.deps.corpus_store, get_context=recorded)
            return Agent(model, box, budget=budget, max_output_tokens=cfg.lm.agent.max_tokens)

        def on_trace(trace: Trace) -> None:
            self.evals.log_observations(
                setting.eval_key, state, trace.query_id, calls.pop(trace.query_id, [])
            )

        return evaluate(
            questions,
            factory,
            skill="in-context",
            concurrency=cfg.concurrency_for("agent"),
            traces_path=traces_path,
            judge=self.deps.judge,
            progress=self.opts.progress,
            on_trace=on_trace,
        )

    def tokens_used(self) -> int:
        """LLM tokens (input + output, every role) recorded in the ledger so far."""
        if self.deps.ledger is None:
            return 0
        t = self.deps.ledger.totals()
        return int(t["input_tokens"] + t["output_tokens"])

    # -- LoopEnv ------------------------------------------------------------------------------
    def evaluate(self, setting: Setting, split: str) -> Evaluation:
        """Extract what is missing, then run the agent on ``split`` (``tune``, ``validation``, ``all``).

        Questions already evaluated for this setting on the current store state are read back;
        after the store changed, only the questions whose look-ups now return something
        different are run again (see the module docstring).
        """
        questions = self.questions_for(split)
        metrics = self.ensure_extracted(setting, questions)
        coverage = answer_coverage(questions, self.kis_by_doc(setting))
        if coverage is not None:
            metrics["extract_answer_coverage"] = coverage
        state = store_fingerprint(self.store_for(setting))
        path = self.evals.traces_path(setting.eval_key, state)
        reused, have = self.evals.reuse_unaffected(
            setting.eval_key, questions, state, path, lambda: self.context_fn(setting)
        )
        fresh = [q for q in questions if q.query_id not in have]
        self.log(
            f"evaluate setting {setting.key} on {split} ({len(questions)} questions, store {state[:8]}): "
            f"{len(fresh)} to run, {reused} reused after the store changed"
        )
        traces = self.run_agent(setting, questions, traces_path=path, store_state=state)
        metrics["eval_reused"] = float(reused)
        metrics["eval_run"] = float(len(fresh))
        obs = self.evals.observations(setting.eval_key)
        retrieved = {
            q.query_id: tuple(dict.fromkeys(k for c in obs.get((state, q.query_id), []) for k in c["ki_ids"]))
            for q in questions
        }
        gold = {q.query_id: tuple(q.gold_docids or q.evidence_docids) for q in questions}
        return Evaluation(
            summarize(traces, f"{split}-{setting.key}"),
            tuple(traces),
            metrics,
            gold_docids=gold,
            retrieved=retrieved,
            store_state=state,
        )

    def improve(
        self, setting: Setting, tune: Evaluation, iteration: int, *, ledger: FailureLedger | None = None
    ) -> Proposal:
        """Prompt optimisation of each selected program, Optuna knobs, then feedback KIs routed by kind."""
        from kitune.service import improve

        prompts = dict(setting.prompts)
        knobs: dict[str, int | float] = dict(setting.knobs)
        metrics: dict[str, float] = {}
        notes: dict[str, Any] = {}
        programs: dict[str, Any] = {}
        failures = collect_failures(tune.traces, self.tune)
        kinds = {t.query_id: classify_failure(t, tune.gold_docids.get(t.query_id)) for t in tune.traces}
        for program in self.opts.programs:
            if program not in prompts:
                continue
            try:
                result = improve.optimize_program(
                    self, program, setting, failures, iteration, tune=tune, kinds=kinds
                )
            except OptimizationError as e:  # one program's failure never sinks the iteration
                notes[f"{program}_error"] = str(e)[:1000]
                metrics[f"{program}_failed"] = 1.0
                self.log(f"[yellow]{program}: optimisation skipped: {e}[/]")
                continue
            if result is None:
                continue
            new_text = result.best_candidate.get(_PREDICTOR[program], prompts[program])
            metrics[f"{program}_metric_calls"] = float(result.metric_calls)
            metrics[f"{program}_best_score"] = result.best_score
            if result.baseline_score is not None:
                metrics[f"{program}_baseline_score"] = result.baseline_score
            notes[f"{program}_stop_reason"] = result.stop_reason
            if result.improved and new_text.strip():
                prompts[program] = new_text
                programs[program] = result.program
        if self.opts.knob_trials > 0:
            knobs.update(improve.tune_knobs(self, setting, iteration, notes, metrics))
        if self.opts.feedback and failures:
            routed, skipped = route_feedback(
                failures, kinds, ledger, max_attempts=self.cfg.optimize.max_feedback_attempts
            )
            metrics.update({f"feedback_skipped_{k}": float(v) for k, v in skipped.items()})
            if routed:
                metrics.update(
                    improve.write_feedback(self, setting, tune, routed, iteration, ledger=ledger, notes=notes)
                )
        return Proposal(Setting(prompts, knobs), metrics=metrics, programs=programs, notes=notes)

    def close(self) -> None:
        """Close every store opened."""
        for store in self._stores.values():
            store.close()
        self._stores.clear()


def route_feedback(
    failures: Sequence[Any],
    kinds: Mapping[str, str | None],
    ledger: FailureLedger | None,
    *,
    max_attempts: int,
) -> tuple[list[Any], dict[str, int]]:
    """Which failures go to the disambiguator this iteration, and why the others do not.

    A failure goes when its kind is in :data:`DISAMBIGUATION_KINDS` (a blank answer goes too, to
    be counted as a rejected ``empty_prediction`` candidate) and the ledger allows another
    attempt (fewer than ``max_attempts`` so far, and not for the same wrong answer as before).

    Returns:
        ``(failures to send, reason → count of the ones held back)``; reasons are the failure
        kind (``no_candidate`` …, those go to extractor and rewriter feedback instead),
        ``max_attempts`` and ``same_wrong_answer``.
    """
    routed: list[Any] = []
    skipped: dict[str, int] = {}
    for f in failures:
        kind = kinds.get(f.query_id)
        if f.prediction.strip() and kind not in DISAMBIGUATION_KINDS:
            skipped[str(kind)] = skipped.get(str(kind), 0) + 1
            continue
        if ledger is not None and f.prediction.strip():
            ok, why = ledger.should_attempt(f.query_id, f.prediction, max_attempts)
            if not ok:
                skipped[why] = skipped.get(why, 0) + 1
                continue
        routed.append(f)
    return routed, skipped
