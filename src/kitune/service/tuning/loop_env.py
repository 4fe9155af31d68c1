"""The loop environment :class:`ServiceLoopEnv`: the real :class:`kitune.optimizers.loop.LoopEnv`.

What it does per loop step:

* **extract only what changed** — KIs live in one store table per extractor prompt version
  (``<table>-<sha8>``) with a resume file per version
  (:func:`kitune.service.pipelines.extraction.default_state_path`), so a setting's extraction only
  touches documents without KIs for its extractor version; disambiguation KIs are copied into a
  new version's table so feedback is never lost;
* **evaluate** — the in-context agent (disambiguation KIs visible, the query rewriter with the
  setting's instruction when ``rewriter`` is tuned) on the questions of a split. The cache key
  is the setting, the run's agent settings
  (:func:`~kitune.service.pipelines.eval_cache.eval_config_key`: loop bounds, ``agent.max_tokens``,
  call rules, rendering, retrieval sizes, grader, models) *and the KI store's state*
  (:func:`~kitune.service.pipelines.eval_cache.store_fingerprint`): traces go to
  ``<state>/evals/<setting eval key>-<config key>-<store fingerprint>.jsonl`` (the eval key
  leaves out the disambiguator's instruction, which changes what is written, not what is read) and every
  ``get_context`` call the agent made is logged (query, SHA-256 of the observation text, KI ids shown) to
  ``<state>/evals/observations.jsonl``. When the store has changed since a question's last trace
  for this setting, its look-ups are replayed against the store as it is now: if every
  observation is identical, the agent (deterministic at temperature 0) would see exactly what it
  saw before, so the trace is reused; otherwise the question is run again. A rerun, or another
  split of the same setting on the same store, reuses finished questions
  (:class:`~kitune.service.pipelines.eval_cache.EvalCache`);
* **extract once per instruction** — the extractor handed to ``extract_corpus`` and to the
  extractor's GEPA task is a :class:`~kitune.optimizers.extraction_cache.CachedFactExtractor` on
  ``<state>/extractions`` (keyed by instruction + limits and document content), so GEPA's seed
  evaluation reads what the loop extracted and the loop reuses what GEPA extracted for an
  accepted instruction;
* **stage metrics** — every evaluation also measures each program on its own signal
  (:meth:`ServiceLoopEnv.stage_report`: extractor coverage and grounding, rewriter recall@k and
  MRR with one :meth:`~ServiceLoopEnv.lookup` per question), flattened into
  ``Evaluation.metrics`` as ``stage_*`` and kept as ``Evaluation.stages``;
* **credit** — after each start-of-iteration measurement the loop calls
  :meth:`~ServiceLoopEnv.record_credit`: the KIs each episode was shown are credited in
  ``<state>/ki_credit.json`` (:mod:`kitune.optimizers.credit`); a KI whose verdict is ``retire``
  gets status ``expired`` (re-applied after every extraction), a demoted one is ranked down in
  every ``get_context`` (:meth:`~ServiceLoopEnv.context_fn`), and the penalties are part of the
  evaluation cache's store state (:meth:`~ServiceLoopEnv.store_state`);
* **improve** — a fold over the configured improvers (``optimize.improvers``, one file each in
  :mod:`kitune.optimizers.improvers`): (a) ``prompts``, the optimiser on each selected
  program's task (:mod:`kitune.optimizers.programs`), (b) ``knobs``, Optuna with an LLM-free
  objective, its study on disk at ``<state>/knobs.journal``, and (c) ``disambiguation``, the
  tuning failures routed by failure kind through the failure ledger. The improvers get the
  iteration's data as one frozen :class:`~kitune.optimizers.improve_env.ImproveInput` (built
  here: the tuning run, failures, kinds, questions, documents, the setting's KIs, config, LMs,
  budget, options) and this environment only as the read-only
  :class:`~kitune.optimizers.improve_env.ImproveEnv` view (``lookup``, ``lookup_texts``,
  ``context_ids``, ``extractor``); they return proposals. The feedback KIs an improvement asks
  for are written here, on the loop's side, and kept only when the gate
  (:mod:`kitune.optimizers.gate`, :meth:`~ServiceLoopEnv.lookup_changes` +
  :meth:`~ServiceLoopEnv.retire`) finds they break no question
  (:func:`kitune.optimizers.feedback_step.apply_feedback`).

Every dependency (LMs, agent model, judge, store factory, corpus store) can be injected through
:class:`LoopDeps`, so the whole loop runs in tests with scripted models
(:func:`kitune.service.tuning.optimize.default_deps` builds the real ones).
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import dspy

from kitune.config import KituneConfig, RetrievalConfig, with_overrides
from kitune.data.loaders import Question
from kitune.errors import DocumentNotFoundError
from kitune.evaluation.agent import Agent
from kitune.evaluation.budget import Budget
from kitune.evaluation.failures import classify_failure
from kitune.evaluation.harness import evaluate
from kitune.evaluation.report import summarize
from kitune.evaluation.stage_metrics import (
    ExtractionCounts,
    StageMetric,
    StageReport,
    extractor_metrics,
    per_question_values,
    rewriter_metrics,
)
from kitune.evaluation.tools import build_toolbox
from kitune.optimizers.budget import OptimizerBudget
from kitune.optimizers.credit import CreditLedger, demote_ranked, episodes_from_traces, retire_kis
from kitune.optimizers.extraction_cache import CachedFactExtractor, ExtractionCache, extractor_key
from kitune.optimizers.feedback import collect_failures
from kitune.optimizers.feedback_step import apply_feedback
from kitune.optimizers.improve_env import ImproveInput
from kitune.optimizers.improver import IMPROVERS, run_improvers
from kitune.optimizers.ledger import FailureLedger
from kitune.optimizers.loop import Evaluation, Proposal, Setting
from kitune.optimizers.objective import answer_coverage
from kitune.optimizers.power import PRIOR_SD, measured_sd, minimum_detectable_effect
from kitune.optimizers.program_task import eval_key
from kitune.programs.fact_extractor import FactExtractor
from kitune.schema import Document, Filter
from kitune.service.pipelines import extraction
from kitune.service.pipelines.eval_cache import EvalCache, eval_config_key, lookup_record, store_fingerprint
from kitune.service.pipelines.evaluation import make_context_fn
from kitune.service.pipelines.extraction import default_state_path, read_state
from kitune.service.serving import context as serving_context
from kitune.service.serving.prompts import versioned_store_cfg
from kitune.service.serving.setting import rewriter_for
from kitune.service.tuning import improve
from kitune.service.tuning.improve import reflection_context_tokens, reflection_fallback
from kitune.service.tuning.options import E2E_AUTO
from kitune.service.tuning.slicing import SliceSplit, split_slice

if TYPE_CHECKING:
    from kitune.chat import ChatModel
    from kitune.evaluation.metrics import JudgeFn
    from kitune.evaluation.trace import Trace
    from kitune.ki import KI
    from kitune.retrieval.base import CorpusStore, Store
    from kitune.service.tuning.options import OptimizeOptions
    from kitune.usage import TokenLedger

__all__ = ["LoopDeps", "ServiceLoopEnv", "e2e_sample_size"]

logger = logging.getLogger(__name__)


def e2e_sample_size(sd: float, *, alpha: float, power: float, margin: float, limit: int = 10_000) -> int:
    """The fewest paired questions whose end-to-end minimum detectable effect is at most ``margin``.

    The smallest ``n`` with :func:`kitune.optimizers.power.minimum_detectable_effect` ``(n, sd,
    alpha, power) ≤ margin`` — the non-inferiority check's normal approximation (one-sided
    ``alpha``, prior correlation 0.5): with ``sd`` 0.5, α 0.05, power 0.8 and margin 0.10 it is
    155. Capped at ``limit``.

    Raises:
        ValueError: ``margin`` ≤ 0 or an argument :func:`minimum_detectable_effect` refuses.
    """
    if margin <= 0:
        raise ValueError(f"margin={margin}: the non-inferiority margin must be above 0 to size a sample")
    n = 1
    while n < limit and minimum_detectable_effect(n, sd, alpha=alpha, power=power) > margin:
        n += 1
    return n


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
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.cfg = cfg
        self.opts = opts
        self.deps = deps
        self.questions = list(questions)
        self.documents = {d.docid: d for d in documents}
        self.state_dir = state_dir
        self.log: Callable[[str], None] = log if log is not None else lambda _m: None
        self.split: SliceSplit = split_slice(
            self.questions,
            method=opts.split,
            validation_fraction=cfg.optimize.validation_fraction,
            seed=cfg.optimize.seed,
        )
        """How the questions were split (``--split``; recorded in ``questions.json``)."""
        self.tune, self.validation = list(self.split.tune), list(self.split.validation)
        self._stores: dict[str, Store] = {}
        self._extracted: set[tuple[str, frozenset[str]]] = set()
        self._failed: dict[str, set[str]] = {}
        self._retried: dict[str, set[str]] = {}  # extractor version -> docids retried after a timeout
        """Extractor version → documents that failed in this process (retried by the next run only)."""
        self.lock = threading.RLock()
        self.evals = EvalCache(state_dir / "evals", self.lock)
        self._config_key = eval_config_key(cfg)
        """Traces and look-up log of every evaluation, keyed by setting and store state."""
        self.extractions = ExtractionCache(state_dir / "extractions")
        """Every document extraction, keyed by extractor instruction + limits and document content."""
        self.credit = CreditLedger(state_dir / "ki_credit.json")
        """Per-KI shown-right / shown-wrong / harmful counts (:mod:`kitune.optimizers.credit`)."""
        self._fingerprints: dict[tuple[int, str], str] = {}
        self._lookups: dict[tuple[str, str, str], Any] = {}
        self._stages: dict[tuple[str, str, str], StageReport] = {}
        self.rng = random.Random(cfg.optimize.seed)
        IMPROVERS.check(cfg.optimize.improvers, setting="optimize.improvers")
        self._window: tuple[int | None] | None = None
        self._e2e_auto: int | None = None
        self.reflection_note = reflection_fallback(cfg)
        """Why the optimisers reflect with the task model (no ``lm.reflection.model``), or None."""
        if self.reflection_note:  # said once: through ``log`` when given, else the logging module
            if log is not None:
                log(f"[yellow]warning: {self.reflection_note}[/]")
            else:
                logger.warning(self.reflection_note)

    def reflection_window(self) -> int | None:
        """The reflection model's context window, asked once (see ``improve.reflection_context_tokens``)."""
        if self._window is None:
            window = reflection_context_tokens(self.cfg)
            self._window = (window,)
            if window is None:
                self.log(
                    "[yellow]warning: the reflection model's context window is unknown (not in LiteLLM's "
                    "table, not reported by the server): reflection prompts are not sized; set "
                    "optimize.reflection_context_tokens[/]"
                )
        return self._window[0]

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

    def agent_questions(self, split: str, questions: Sequence[Question]) -> list[Question]:
        """The questions of ``split`` a measurement runs the agent on (the stage metrics use all).

        ``measure="full"`` (``kitune optimize --measure full``, the default) or the split ``all``:
        every question. ``measure="stage"``: tuning questions only with ``tune_agent``;
        validation questions: the first ``e2e_sample`` of a shuffle of the validation ids seeded
        by ``optimize.seed`` (the same subset every iteration and for every setting, so current
        and candidate runs pair), all of them when ``e2e_sample`` exceeds the split, none at 0.
        """
        if self.opts.measure != "stage" or split not in ("tune", "validation"):
            return list(questions)
        if split == "tune":
            return list(questions) if self.opts.tune_agent else []
        ids = sorted(q.query_id for q in questions)
        random.Random(f"e2e-sample:{self.cfg.optimize.seed}").shuffle(ids)
        keep = set(ids[: self.e2e_sample_size(len(ids))])
        return [q for q in questions if q.query_id in keep]

    def e2e_sample_size(self, n_validation: int) -> int:
        """How many validation questions the agent runs on per measurement under ``measure="stage"``.

        ``e2e_sample`` ≥ 0: that many (at most the split). ``E2E_AUTO``: :func:`e2e_sample_size`
        with ``optimize.alpha``, ``optimize.power`` and ``optimize.noninferiority_margin`` and the
        end-to-end accuracy's standard deviation measured in this run's cache (else the prior),
        logged once.
        """
        if self.opts.e2e_sample != E2E_AUTO:
            return min(max(self.opts.e2e_sample, 0), n_validation)
        if self._e2e_auto is None:
            o = self.cfg.optimize
            sd, source = measured_sd(self.state_dir).get(
                "end_to_end_accuracy", (PRIOR_SD["end_to_end_accuracy"], "prior")
            )
            wanted = e2e_sample_size(sd, alpha=o.alpha, power=o.power, margin=o.noninferiority_margin)
            self._e2e_auto = min(wanted, n_validation)
            self.log(
                f"--e2e-sample auto: the end-to-end non-inferiority check (margin {o.noninferiority_margin}, "
                f"alpha {o.alpha}, power {o.power}, sd {sd:.3f} {source}) needs {wanted} paired questions; "
                f"running the agent on {self._e2e_auto} of {n_validation} validation questions"
                + (" (all: the split is smaller than the power asks)" if wanted > n_validation else "")
            )
        return self._e2e_auto

    def eval_key(self, setting: Setting) -> str:
        """What an evaluation of ``setting`` is cached under: its eval key and the config key.

        :func:`~kitune.optimizers.program_task.eval_key` names the setting (instructions, knobs);
        :func:`~kitune.service.pipelines.eval_cache.eval_config_key` the run's agent, retrieval,
        grading, embedder and model settings, so changing ``agent.max_steps``, ``agent.max_tokens``,
        the call rules or the rendering never reuses the answers of a run made without them.
        """
        return f"{eval_key(setting)}-{self._config_key}"

    def setting_cfg(self, setting: Setting) -> KituneConfig:
        """``cfg`` with the setting's knobs applied."""
        return with_overrides(self.cfg, setting.knobs)

    def _plain_extractor(self, setting: Setting) -> Any:
        return FactExtractor.from_config(self.setting_cfg(setting), setting.prompts.get("extractor"))

    def extractor(self, setting: Setting) -> Any:
        """A ``FactExtractor`` with the setting's instruction and limits that reads and fills the cache.

        A :class:`~kitune.optimizers.extraction_cache.CachedFactExtractor` on
        ``<state>/extractions``: the loop's own extraction and GEPA's metric calls share it, so no
        document is extracted twice with one instruction.
        """
        return CachedFactExtractor.wrap(self._plain_extractor(setting), self.extractions)

    def store_for(self, setting: Setting) -> Store:
        """The KI store of the setting's extractor version (opened once, disambiguation KIs carried over)."""
        version = self._plain_extractor(setting).prompt_version
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
        return rewriter_for(setting.prompts["rewriter"], self.deps.lms["rewrite"])

    def context_fn(self, setting: Setting, rewriter: Any = None, *, disambiguation: bool = True) -> Any:
        """The agent's ``get_context`` tool for ``setting`` (rewriter None: the setting's own)."""
        rw = rewriter if rewriter is not None else self.rewriter(setting)
        return make_context_fn(
            self.setting_cfg(setting),
            self.store_for(setting),
            disambiguation=disambiguation,
            ledger=self.deps.ledger,
            rewriter=rw,
            rerank=self._rerank(),
        )

    def _rerank(self) -> Callable[[list[Any]], list[Any]] | None:
        """The credit demotion for ``get_context`` (None while no KI is demoted or retired)."""
        penalties = self.credit.penalties()
        if not penalties:
            return None

        def rerank(kis: list[Any]) -> list[Any]:
            return demote_ranked(
                kis, penalties, id_of=lambda k: k.id, score_of=lambda k: max(float(k.score), 0.0)
            )

        return rerank

    def lookup(self, setting: Setting, query: str, rewriter: Any = None) -> Any:
        """One ``get_context`` as the agent makes it: a ``ContextResponse`` (``retrieval.default_size`` KIs).

        ``rewriter`` None: the setting's own (memoised per setting, store state and query, so the
        rewriter's stage metric and its task reuse one rewrite per question); feedback KIs
        visible; credit demotion applied.
        """
        cfg = self.setting_cfg(setting)
        key: tuple[str, str, str] | None = None
        if rewriter is None:
            key = (self.eval_key(setting), self.store_state(setting), query)
            with self.lock:
                if key in self._lookups:
                    return self._lookups[key]
        rw = rewriter if rewriter is not None else self.rewriter(setting)
        resp = serving_context.get_context(
            query,
            store=self.store_for(setting),
            rewriter=rw,
            size=cfg.retrieval.default_size,
            cfg=cfg,
            ledger=self.deps.ledger,
            rerank=self._rerank(),
        )
        if key is not None:
            with self.lock:
                self._lookups[key] = resp
        return resp

    def store_state(self, setting: Setting) -> str:
        """16 hex characters naming what the setting's look-ups read: KI store content and credit penalties.

        Equal to :func:`~kitune.service.pipelines.eval_cache.store_fingerprint` while no KI is demoted or
        retired (so earlier evaluation caches stay valid); otherwise the penalties are hashed in,
        since a demotion changes what ``get_context`` returns without changing the store.
        """
        store = self.store_for(setting)
        memo = (id(store), store.fingerprint())
        with self.lock:
            content = self._fingerprints.get(memo)
        if content is None:
            content = store_fingerprint(store)
            with self.lock:
                self._fingerprints[memo] = content
        penalties = self.credit.penalties()
        if not penalties:
            return content
        blob = json.dumps([content, sorted(penalties.items())])
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]

    def lookup_changes(
        self, setting: Setting, before_state: str
    ) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
        """KI ids the tuning and validation questions' logged look-ups showed at ``before_state``, and now.

        See :meth:`kitune.service.pipelines.eval_cache.EvalCache.lookup_changes`; the replay uses the
        setting's ``get_context`` on the store as it is now.
        """
        ids = [q.query_id for q in self.questions]
        return self.evals.lookup_changes(self.eval_key(setting), before_state, ids, self.context_fn(setting))

    def retire(self, setting: Setting, ki_ids: Sequence[str], *, reason: str = "gate") -> int:
        """Set status ``expired`` on ``ki_ids`` in the setting's store and remember them.

        The ids are kept in ``<state>/retired_kis.json`` (KI id → ``gate`` or ``credit``) and
        retired again after every extraction: an extraction run re-sights the KIs of unchanged
        documents and refreshes feedback KIs whose evidence documents still exist, which would
        make them ``active`` again (:func:`kitune.service.serving.stores.refresh_derived`).

        Returns:
            How many KIs changed status now (:func:`kitune.optimizers.credit.retire_kis`).
        """
        with self.lock:
            known = self._retired()
            for ki_id in ki_ids:
                known.setdefault(ki_id, reason)
            path = self.state_dir / "retired_kis.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(known, indent=1, sort_keys=True), encoding="utf-8")
            return retire_kis(self.store_for(setting), ki_ids)

    def _retired(self) -> dict[str, str]:
        """KI id → why it was retired (``gate``, ``credit``), from ``<state>/retired_kis.json``."""
        path = self.state_dir / "retired_kis.json"
        if not path.is_file():
            return {}
        try:
            return {str(k): str(v) for k, v in json.loads(path.read_text(encoding="utf-8")).items()}
        except (json.JSONDecodeError, AttributeError):
            return {}

    def record_credit(
        self, setting: Setting, iteration: int, split: str, evaluation: Evaluation
    ) -> dict[str, float]:
        """Credit the KIs shown in ``evaluation`` (run ``it<iteration>:<split>``); retire what the rule says.

        Called by the loop after each start-of-iteration measurement; a re-recorded run id (a
        resumed iteration) changes nothing. KIs whose verdict is ``retire`` get status
        ``expired`` in the setting's store (and are re-retired after every extraction, which
        re-sights unchanged documents); demoted ones are ranked down by :meth:`context_fn`.

        Returns:
            ``credit_*`` counts (:meth:`~kitune.optimizers.credit.CreditLedger.to_metrics`).
        """
        episodes = episodes_from_traces(evaluation.traces, evaluation.retrieved or {})
        self.credit.record_run(f"it{iteration}:{split}", episodes)
        todo = self.credit.to_retire()
        if todo:
            n = self.retire(setting, todo, reason="credit")
            self.credit.mark_retired(todo)
            self.log(
                f"credit: retired {n} KI(s) shown in right → wrong flips twice or more: {', '.join(todo)}"
            )
        return self.credit.to_metrics()

    def context_ids(self, setting: Setting, size: int | None = None) -> Callable[[str], list[str]]:
        """Query → KI ids ``get_context`` returns on the setting's store (plain plan; ``size`` None: 10)."""
        store, cfg = self.store_for(setting), self.setting_cfg(setting)
        return (
            serving_context.context_ids(store=store, cfg=cfg)
            if size is None
            else serving_context.context_ids(store=store, cfg=cfg, size=size)
        )

    def lookup_texts(self, setting: Setting, query: str, knobs: Mapping[str, int | float]) -> list[str]:
        """``"<title> <description>"`` of each KI ``get_context`` returns for ``query``, best first.

        ``knobs`` apply on top of the setting's (plain plan, ``retrieval.default_size`` KIs).

        The store's own retrieval knobs are swapped for the call under :attr:`lock` (the knob
        objective asks many settings of one store).
        """
        store = self.store_for(setting)
        cfg = with_overrides(self.setting_cfg(setting), knobs)
        with self.lock:
            old = getattr(store, "retrieval", None)
            if old is not None:
                store.retrieval = RetrievalConfig.model_validate(cfg.retrieval.model_dump())  # type: ignore[attr-defined]
            try:
                resp = serving_context.get_context(
                    query, store=store, size=cfg.retrieval.default_size, cfg=cfg
                )
                return [f"{k.title} {k.description}" for k in resp.kis]
            finally:
                if old is not None:
                    store.retrieval = old  # type: ignore[attr-defined]

    def optimizer_budget(self) -> OptimizerBudget:
        """The optimisers' budget (see :func:`kitune.service.tuning.improve.optimizer_budget`)."""
        return improve.optimizer_budget(self)

    def ensure_extracted(self, setting: Setting, questions: Sequence[Question]) -> dict[str, float]:
        """Extract the documents ``questions`` need (plus distractors) not yet done for this version.

        A document that fails is not retried within this process (a rerun retries it), so a
        document the model cannot handle costs one attempt per run, not one per evaluation.

        Returns:
            Extraction metrics (``extract_*``) of this call; ``{}`` when nothing was extracted.
        """
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
            report = extraction.extract_corpus(
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
        self._retried.setdefault(extractor.prompt_version, set()).update(report.retried)
        retired = self._retired()
        if retired:  # extraction re-sights unchanged documents and refreshes feedback KIs: retire again
            with self.lock:
                retire_kis(store, list(retired))
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

    def failed_documents(self, setting: Setting) -> tuple[str, ...]:
        """Document ids whose extraction with ``setting``'s extractor failed in this process, sorted.

        Their errors are in the extraction state file
        (:func:`~kitune.service.pipelines.extraction.default_state_path`); a rerun retries them.
        """
        return tuple(sorted(self._failed.get(self.extractor(setting).prompt_version, set())))

    def retried_documents(self, setting: Setting) -> tuple[str, ...]:
        """Document ids whose extraction with ``setting``'s extractor timed out and was tried once more."""
        return tuple(sorted(self._retried.get(self.extractor(setting).prompt_version, set())))

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
        label: str | None = None,
    ) -> list[Trace]:
        """Run the in-context agent on ``questions`` (resuming from ``traces_path``).

        Every ``get_context`` call is logged to ``evals/observations.jsonl`` with the setting
        key and ``store_state`` (see the module docstring). ``label`` names the run in the
        progress lines (None: ``in-context``).
        """
        cfg = self.setting_cfg(setting)
        context_fn = self.context_fn(setting, disambiguation=disambiguation)
        budget = Budget.from_config(cfg.agent)
        model = self.deps.chat_model
        calls: dict[str, list[dict[str, Any]]] = {}
        state = store_state if store_state is not None else self.store_state(setting)

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
                self.eval_key(setting), state, trace.query_id, calls.pop(trace.query_id, [])
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
            label=label,
        )

    def input_tokens_used(self) -> int:
        """LLM input tokens (every role) recorded in the ledger so far; 0 without a ledger."""
        if self.deps.ledger is None:
            return 0
        return int(self.deps.ledger.totals()["input_tokens"])

    def tokens_used(self) -> int:
        """LLM tokens (input + output, every role) recorded in the ledger so far."""
        if self.deps.ledger is None:
            return 0
        t = self.deps.ledger.totals()
        return int(t["input_tokens"] + t["output_tokens"])

    # -- LoopEnv ------------------------------------------------------------------------------
    def evaluate(
        self, setting: Setting, split: str, *, label: str | None = None, every_question: bool = False
    ) -> Evaluation:
        """Extract what is missing, compute the stage metrics, then run the agent on ``split``.

        ``split`` is ``tune``, ``validation`` or ``all``. The stage metrics cover every question
        of the split; the agent runs on :meth:`agent_questions` (every question with
        ``every_question`` — the final evaluation), so with ``measure="stage"`` the returned
        traces and summary may cover a subset or nothing (``eval_agent_questions`` says how many).
        Questions already evaluated for this setting on the current store state are read back;
        after the store changed, only the questions whose look-ups now return something
        different are run again (see the module docstring). ``label`` names the run in the
        progress lines (None: ``in-context``).
        """
        everyone = self.questions_for(split)
        metrics = self.ensure_extracted(setting, everyone)
        coverage = answer_coverage(everyone, self.kis_by_doc(setting))
        if coverage is not None:
            metrics["extract_answer_coverage"] = coverage
        state = self.store_state(setting)
        stages = self.stage_report(setting, split, everyone, state)
        metrics.update(stages.to_metrics("stage"))
        questions = list(everyone) if every_question else self.agent_questions(split, everyone)
        metrics["eval_agent_questions"] = float(len(questions))
        path = self.evals.traces_path(self.eval_key(setting), state)
        reused, have = self.evals.reuse_unaffected(
            self.eval_key(setting), questions, state, path, lambda: self.context_fn(setting)
        )
        fresh = [q for q in questions if q.query_id not in have]
        self.log(
            f"evaluate setting {setting.key} on {split} ({len(everyone)} questions, stage metrics on "
            f"all, the agent on {len(questions)}; store {state[:8]}): "
            f"{len(fresh)} to run, {reused} reused after the store changed"
        )
        traces = (
            self.run_agent(setting, questions, traces_path=path, store_state=state, label=label)
            if questions
            else []
        )
        metrics["eval_reused"] = float(reused)
        metrics["eval_run"] = float(len(fresh))
        obs = self.evals.observations(self.eval_key(setting))
        retrieved = {
            q.query_id: tuple(dict.fromkeys(k for c in obs.get((state, q.query_id), []) for k in c["ki_ids"]))
            for q in questions
        }
        gold = {q.query_id: tuple(q.gold_docids or q.evidence_docids) for q in everyone}
        return Evaluation(
            summarize(traces, f"{split}-{setting.key}"),
            tuple(traces),
            metrics,
            gold_docids=gold,
            retrieved=retrieved,
            store_state=state,
            stages=stages,
        )

    def stage_report(
        self, setting: Setting, split: str, questions: Sequence[Question], state: str
    ) -> StageReport:
        """The split's stage metrics on the store as it is (memoised per setting, store state and split).

        Extractor: answer coverage, evidence coverage, grounding rate (from the extraction
        cache's per-document counters; left out when no document of the split is in it), KI
        tokens per document. Rewriter: recall@k and MRR of one :meth:`lookup` per question with
        the setting's rewriter (the plain plan when ``rewriter`` is not tuned), ``k =
        retrieval.default_size``. Each question's own values are kept too
        (``StageReport.per_question``, for paired decisions) with the look-up's top-``k`` KI ids
        (``StageReport.retrieved``, which the gate compares before and after a change). Written to
        ``<state>/evals/stages-<key>-<state>-<split>.json`` (``metrics``, ``per_question``,
        ``retrieved``) so a resumed run does not ask the rewriter again; a file in the earlier
        format (a bare list of metrics) is measured again.
        """
        key = (self.eval_key(setting), state, split)
        path = self.evals.evals_dir / f"stages-{key[0]}-{state}-{split}.json"
        with self.lock:
            if key in self._stages:
                return self._stages[key]
        if path.is_file():
            try:
                saved = json.loads(path.read_text(encoding="utf-8"))
                # written before per-question values were kept (a bare list): measured again
                report = (
                    StageReport(
                        split,
                        tuple(StageMetric(**r) for r in saved["metrics"]),
                        saved["per_question"],
                        {q: tuple(ids) for q, ids in saved["retrieved"].items()},
                    )
                    if isinstance(saved, dict)
                    else None
                )
            except (json.JSONDecodeError, TypeError, KeyError):
                report = None
            if report is not None:
                with self.lock:
                    self._stages[key] = report
                return report
        kis_by_doc = self.kis_by_doc(setting)
        extractor = self._plain_extractor(setting)
        docids = dict.fromkeys(d for q in questions for d in (*q.evidence_docids, *q.gold_docids))
        docs = [self.documents[d] for d in docids if d in self.documents]
        results = self.extractions.results(extractor_key(extractor), docs)
        counts = ExtractionCounts.from_results(results) if results else None
        workers = max(1, self.cfg.concurrency_for("agent"))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kitune-stage") as pool:
            # one rewrite + look-up per question, as many at once as the agent runs questions
            found = list(pool.map(lambda q: self.lookup(setting, q.query).kis, questions))
        lookups = {q.query_id: kis for q, kis in zip(questions, found, strict=True)}
        k = self.setting_cfg(setting).retrieval.default_size
        metrics = (
            *extractor_metrics(questions, kis_by_doc, counts),
            *rewriter_metrics(questions, lookups, k=k),
        )
        per_question = per_question_values(questions, kis_by_doc, lookups, k=k)
        retrieved = {qid: tuple(ki.id for ki in kis[:k]) for qid, kis in lookups.items()}
        report = StageReport(split, metrics, per_question, retrieved)
        path.parent.mkdir(parents=True, exist_ok=True)
        saved = {
            "metrics": [asdict(m) for m in metrics],
            "per_question": per_question,
            "retrieved": retrieved,
        }
        path.write_text(json.dumps(saved, indent=1), encoding="utf-8")
        with self.lock:
            self._stages[key] = report
        return report

    def improve(
        self, setting: Setting, tune: Evaluation, iteration: int, *, ledger: FailureLedger | None = None
    ) -> Proposal:
        """Fold the configured improvers (``optimize.improvers``) over this iteration's input.

        The input (:class:`~kitune.optimizers.improve_env.ImproveInput`, frozen, built once here) is
        the tuning run, its failures (:func:`~kitune.optimizers.feedback.collect_failures`) and their
        failure kinds, the ledger, the tuning questions, the slice's documents, the setting's
        extracted KIs, the config with its knobs, the LMs, the optimiser budget and the options;
        the feedback KIs an improvement asks for are written and gated here as it returns
        (:func:`~kitune.optimizers.feedback_step.apply_feedback`); see
        :func:`kitune.optimizers.improver.run_improvers`.
        """
        failures = collect_failures(tune.traces, self.tune)
        kinds = {t.query_id: classify_failure(t, tune.gold_docids.get(t.query_id)) for t in tune.traces}
        inp = ImproveInput(
            setting,
            tune,
            iteration,
            tuple(failures),
            kinds,
            ledger,
            questions=tuple(self.tune),
            cfg=self.setting_cfg(setting),
            budget=self.optimizer_budget(),
            options=self.opts,
            state_dir=self.state_dir,
            reflection_note=self.reflection_note,
            documents=MappingProxyType(self.documents),
            kis_by_doc=MappingProxyType(self.kis_by_doc(setting)),
            lms=MappingProxyType(dict(self.deps.lms)),
        )
        return run_improvers(
            self, inp, self.cfg.optimize.improvers, apply=lambda imp: apply_feedback(self, inp, imp)
        )

    def close(self) -> None:
        """Close every store opened."""
        for store in self._stores.values():
            store.close()
        self._stores.clear()
