"""What program tasks and improvers receive and return: the environment, the input, the improvement.

:class:`ImproveEnv`, :class:`ImproveInput`, :class:`Improvement`.

An improver (:class:`Improver`) is one room of the improve step; its module imports only this
one (and what it uses), never the registry that lists it (:mod:`kitune.optimizers.improver`).

The loop's environment (:class:`kitune.service.tuning.loop_env.ServiceLoopEnv` in the service layer)
owns every LLM, store and cache; the optimisers' code sees it only through this protocol, so the
rooms of the improve step (:mod:`kitune.optimizers.programs`, :mod:`kitune.optimizers.improvers`)
live here, below the service layer, and run in tests against fakes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from kitune.errors import DocumentNotFoundError
from kitune.optimizers.setting import Evaluation, Setting

if TYPE_CHECKING:
    import random

    from kitune.config import KituneConfig
    from kitune.data.loaders import Question
    from kitune.ki import KI
    from kitune.optimizers.budget import OptimizerBudget
    from kitune.optimizers.feedback import Failure
    from kitune.optimizers.ledger import FailureLedger
    from kitune.retrieval.base import Store
    from kitune.schema import Document

__all__ = ["ImproveEnv", "ImproveInput", "Improvement", "Improver", "LoopOptionsLike"]


class LoopOptionsLike(Protocol):
    """The command's options as the improve step reads them (``OptimizeOptions`` in the service)."""

    @property
    def optimizer(self) -> str:
        """Optimiser name in :mod:`kitune.optimizers.registry`."""
        ...

    @property
    def programs(self) -> tuple[str, ...]:
        """Programs whose instruction the loop tunes."""
        ...

    @property
    def knob_trials(self) -> int:
        """Optuna trials per iteration (0: no knob tuning)."""
        ...

    @property
    def feedback(self) -> bool:
        """Write disambiguation KIs from the tuning failures."""
        ...

    @property
    def run_name(self) -> str:
        """The loop's state folder name (names the knob study)."""
        ...


class ImproveEnv(Protocol):
    """The loop's read-only view as program tasks and improvers use it: look-ups, no runs, no writes.

    What an improver needs to *know* (the tuning questions, the documents, the setting's KIs,
    the configuration, the LMs, the budget, the options, the incumbent setting and its run) is
    data on :class:`ImproveInput`; this protocol holds only what needs the loop's machinery: a
    look-up on the setting's store (cached, with a candidate rewriter, or with candidate knobs),
    an extractor that reads the extraction cache, the seed source, the token count, a progress
    line. Agent runs, KI writes, the gate and retirement are the loop's
    (:mod:`kitune.optimizers.feedback_step`); an improver proposes, the loop evaluates, gates,
    decides and logs. One exception: the disambiguator task's metric writes a candidate KI to
    ``store_for``'s store, asks ``context_ids`` and removes it again (under its own lock).

    Contract: every method is safe to call from several threads (GEPA's metric threads call
    ``lookup`` and ``store_for``).
    """

    @property
    def rng(self) -> random.Random:
        """Seeds the optimisers (one draw per optimiser run)."""
        ...

    def log(self, message: str) -> None:
        """A progress line."""
        ...

    def store_for(self, setting: Setting) -> Store:
        """The KI store of the setting's extractor version."""
        ...

    def extractor(self, setting: Setting) -> Any:
        """A ``FactExtractor`` with the setting's instruction and limits."""
        ...

    def context_ids(self, setting: Setting, size: int | None = None) -> Callable[[str], list[str]]:
        """Query → the KI ids ``get_context`` returns on the setting's store (plain plan)."""
        ...

    def lookup_texts(self, setting: Setting, query: str, knobs: Mapping[str, int | float]) -> list[str]:
        """``"<title> <description>"`` of each KI ``get_context`` returns for ``query``, ``knobs`` applied."""
        ...

    def lookup(self, setting: Setting, query: str, rewriter: Any = None) -> Any:
        """One ``get_context`` call as the agent would make it: a ``ContextResponse`` (``.kis`` best first).

        ``rewriter`` None: the setting's own (the plain plan when ``rewriter`` is not tuned);
        feedback KIs visible, credit demotion applied, ``retrieval.default_size`` KIs.
        """
        ...

    def input_tokens_used(self) -> int:
        """LLM input tokens recorded in the token ledger so far, every role (0 without a ledger)."""
        ...


@dataclass(frozen=True)
class ImproveInput:
    """What one iteration's improve step starts from: immutable data, the same for every improver.

    Built once per iteration by the loop's environment
    (:meth:`kitune.service.tuning.loop_env.ServiceLoopEnv.improve`); an improver reads what it
    needs here rather than asking the loop, and returns an :class:`Improvement`. The mappings
    are read-only views (``types.MappingProxyType``) of what the loop holds.
    """

    setting: Setting
    """The current setting (improvers propose changes to it)."""
    tune: Evaluation
    """Its run on the tuning split."""
    iteration: int
    """0-based."""
    failures: tuple[Failure, ...] = ()
    """The tuning run's wrong answers (:func:`kitune.optimizers.feedback.collect_failures`)."""
    kinds: Mapping[str, str | None] = field(default_factory=dict)
    """Query id → failure kind (None: correct)."""
    ledger: FailureLedger | None = None
    """The failure ledger (routes feedback, records attempts)."""
    _: KW_ONLY
    questions: tuple[Question, ...]
    """The tuning split's questions (``tune`` is their run)."""
    cfg: KituneConfig
    """The configuration with the setting's knobs applied."""
    budget: OptimizerBudget
    """The optimiser budget (options + config), the same for every optimiser run this iteration."""
    options: LoopOptionsLike
    """The command's options (optimiser, programs, knob trials, feedback, run name)."""
    state_dir: Path
    """The loop's state folder (the knob study's journal lives there)."""
    reflection_note: str | None = None
    """Why the optimisers reflect with the task model, or None (a reflection model is set)."""
    documents: Mapping[str, Document] = field(default_factory=dict)
    """The slice's documents by id (the questions' evidence documents and the distractors)."""
    kis_by_doc: Mapping[str, Sequence[KI]] = field(default_factory=dict)
    """The setting's extracted KIs (no disambiguation KIs) by evidence document, read from its
    store when the step starts (an improver writes no extracted KI, so it stays true)."""
    lms: Mapping[str, Any] = field(default_factory=dict)
    """LM role → ``dspy.LM``: ``extract`` (the extractor and the disambiguator), ``rewrite``,
    ``reflection`` (the optimisers' reflection model)."""

    def get_document(self, docid: str) -> Document:
        """The slice's document ``docid``.

        Raises:
            DocumentNotFoundError: ``docid`` is not a document of the slice.
        """
        if docid not in self.documents:
            raise DocumentNotFoundError(docid)
        return self.documents[docid]


@dataclass
class Improvement:
    """What one improver proposes (every field optional)."""

    prompts: dict[str, str] = field(default_factory=dict)
    """Program → new instruction."""
    knobs: dict[str, int | float] = field(default_factory=dict)
    """Dotted config key → new value."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Logged as ``improve_<key>`` on the iteration's run."""
    notes: dict[str, Any] = field(default_factory=dict)
    """JSON-able details, logged in ``improve.json``."""
    programs: dict[str, Any] = field(default_factory=dict)
    """Program → optimised ``dspy.Module`` (its state is logged)."""
    feedback: tuple[Failure, ...] = ()
    """Tuning failures to write a feedback (disambiguation) KI for. The improver only names them:
    the loop writes the KIs, gates them and notes them in the ledger
    (:func:`kitune.optimizers.feedback_step.apply_feedback`) right after the improver returns,
    before the next improver runs; the merged metrics and notes are the improvement's."""


@runtime_checkable
class Improver(Protocol):
    """One room of the improve step.

    Contract: ``improve`` never mutates ``inp`` (nor the ledger it holds) and never writes to a KI
    store: feedback KIs are proposed (``Improvement.feedback``) and the loop writes and gates them;
    a failure of one of its own parts (one program's optimiser) is recorded in the metrics/notes,
    not raised; a misconfiguration raises :class:`~kitune.errors.ConfigError`.
    """

    name: str
    """The name ``optimize.improvers`` lists."""

    def improve(self, env: ImproveEnv, inp: ImproveInput) -> Improvement:
        """Propose changes to ``inp.setting`` from the tuning run."""
        ...
