"""``run_eval`` and ``report_runs``: the functions behind ``kitune eval`` and ``kitune report``.

``run_eval`` wires a dataset, the skill's tools (corpus store, KI store + ``get_context``), the
agent chat model and the judge, then calls :func:`kitune.evaluation.harness.evaluate`, writing
``<workdir>/runs/<run-name>/traces.jsonl`` (resumable), ``run.json`` (parameters: skill, data,
the dataset checksum ``data_sha256`` and each file's, split, subset ids, models, budget, prompt
versions) and ``summary.json`` (with ``data_sha256``)/``usage.json`` at the end. Every dependency
can be injected, so the wiring is testable without a store or an LLM; the defaults are built
lazily from the config.

The in-context skill runs what production runs
(:func:`kitune.service.serving.prompts.production_setting`): the KI table of the production extractor
and, with ``rewrite``, the production rewriter prompt — or the versions chosen with
``prompt_select`` / ``packaged``. The default run name ends with that setting's id, so a
promotion starts a new run instead of resuming one made with other prompts.

Failures are failures: questions whose LLM calls failed are ``failed``, not graded, and
excluded from accuracy (counted beside it); an authentication failure stops the run and
raises :class:`kitune.errors.LMAuthError` (see :mod:`kitune.evaluation.harness`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import kitune.lm
import kitune.retrieval
from kitune.config import KituneConfig
from kitune.data.bundled import missing_data_message
from kitune.data.checksum import dataset_checksum
from kitune.data.errata import ErrataReport
from kitune.data.examples import Split, select_split, slice_questions
from kitune.data.loaders import Question, load_corpus, load_questions_and_errata
from kitune.errors import ConfigError, DataError, HarnessError
from kitune.evaluation.agent import Agent
from kitune.evaluation.budget import Budget
from kitune.evaluation.full_context import EVAL_SKILLS, FULL_CONTEXT, full_context_factory
from kitune.evaluation.grading import match_judge
from kitune.evaluation.harness import AgentFactory, evaluate
from kitune.evaluation.judging import judge_pending
from kitune.evaluation.metrics import JudgeFn, Trace
from kitune.evaluation.report import ReportFiles, RunSummary, load_run, run_grader, summarize, write_report
from kitune.evaluation.tools import ContextItem, ContextObservation, Skill, build_toolbox
from kitune.ki import utcnow
from kitune.optimizers.program_task import read_programs
from kitune.programs.instructions import instruction_version
from kitune.programs.judge import Judge
from kitune.schema import Filter
from kitune.service.serving import context as serving_context
from kitune.service.serving.prompts import production_setting, setting_summary
from kitune.service.serving.setting import rewriter_for
from kitune.text import exact_match, token_f1
from kitune.usage import TokenLedger

if TYPE_CHECKING:
    from kitune.chat import ChatModel
    from kitune.retrieval.base import CorpusStore, Store

__all__ = ["EvalRunResult", "default_run_name", "make_context_fn", "make_judge", "report_runs", "run_eval"]


@dataclass(frozen=True)
class EvalRunResult:
    """What one ``kitune eval`` produced."""

    run_dir: Path
    traces_path: Path
    traces: list[Trace]
    summary: RunSummary
    usage: dict[str, dict[str, int]] = field(default_factory=dict)
    """``"role/stage"`` → token totals from the ledger (calls made by this invocation)."""
    prompt_versions: dict[str, str] = field(default_factory=dict)
    """Program → prompt version label used, plus ``"store"`` → KI table (in-context runs that
    resolved their setting; empty otherwise)."""
    reused: int = 0
    """Questions answered by an earlier run of the same run folder and not asked again (the
    resume; ``no_cache`` asks every question again)."""
    replaced: Path | None = None
    """Where ``no_cache`` moved the earlier ``traces.jsonl`` (kept, never deleted)."""
    published_summary: RunSummary | None = None
    """The same run scored on the labels as published (:func:`published_traces`): equal to
    :attr:`summary` when no errata overlay changed a question of the run. ``scores.json`` in the
    run directory holds both (``corrected``, ``published``) and what the overlay changed."""
    errata: ErrataReport | None = None
    """What the errata overlay changed (None: no overlay)."""

    @property
    def answered(self) -> int:
        """Questions whose agent run ended with an answer (status not ``failed``)."""
        return sum(1 for t in self.traces if t.status != "failed")


def default_run_name(
    skill: str,
    data_dir: Path,
    split: str,
    limit: int | None,
    disambiguation: bool,
    setting_id: str | None = None,
) -> str:
    """Deterministic run name, so re-running the same command resumes the same run.

    Args:
        skill: ``baseline``, ``in-context`` or ``closed-book``.
        data_dir: the dataset folder (its name is used).
        split: ``all``, ``tune`` or ``validation``.
        limit: first N questions, or None.
        disambiguation: in-context with disambiguation KIs (``-disamb``).
        setting_id: appended when given (the in-context run's prompt setting, e.g. the KI
            table's ``<sha8>`` and the rewriter's), so runs with other prompts never mix.
    """
    parts = [skill + ("-disamb" if disambiguation else ""), Path(data_dir).resolve().name or "data", split]
    if limit is not None:
        parts.append(f"n{limit}")
    if setting_id:
        parts.append(setting_id)
    return re.sub(r"[^A-Za-z0-9._-]+", "-", "-".join(parts))


def make_judge(cfg: KituneConfig, ledger: TokenLedger | None) -> JudgeFn:
    """The judge ``grading.grader`` selects: the judge role's LM (``llm``) or answer matching (``match``)."""
    if cfg.grading.grader == "match":
        return match_judge

    lm = kitune.lm.build_lm(cfg, "judge", ledger=ledger)
    grader = Judge()

    def judge(*, question: str, response: str, gold: str, aliases: Sequence[str]) -> Any:
        return grader.grade(question, response, gold, aliases=list(aliases), lm=lm)

    return judge


def make_context_fn(
    cfg: KituneConfig,
    store: Store,
    *,
    disambiguation: bool,
    ledger: TokenLedger | None = None,
    rewriter: Any = None,
    rerank: Callable[[list[Any]], list[Any]] | None = None,
) -> Callable[[str], ContextObservation]:
    """Wrap :func:`kitune.service.serving.context.get_context` + ``render_context`` as the agent's tool.

    Without ``disambiguation``, KIs of subtype ``disambiguation`` are dropped from every result
    (so the plain in-context run is not helped by KIs written from failures). With a
    ``rewriter`` (a ``QueryRewriter`` with its LM set), each look-up's rewrite tokens are
    reported on the observation so the run's token totals include them. ``rerank`` is passed to
    ``get_context`` (the loop's KI credit demotion).
    """
    hidden: set[str] = set()
    if not disambiguation:
        hidden = {ki.id for ki in store.iter_kis(Filter(statuses=(), subtypes=("disambiguation",)))}
    size = cfg.retrieval.default_size

    def context_fn(query: str) -> ContextObservation:
        ask = min(size + len(hidden), cfg.retrieval.max_size)
        resp = serving_context.get_context(
            query, store=store, rewriter=rewriter, size=ask, cfg=cfg, ledger=ledger, rerank=rerank
        )
        if hidden or len(resp.kis) > size:
            # the facets too: counted over the search's hits, they named the hidden disambiguation
            # KIs' entities and documents (and the extra KIs asked for to make up for them)
            kis = [k for k in resp.kis if k.id not in hidden][:size]
            resp = resp.model_copy(update={"kis": kis, "aggregations": serving_context.facets_of(kis)})
        docs = tuple(dict.fromkeys(d for k in resp.kis for d in k.evidence_doc_ids))
        text = serving_context.render_context(resp)
        full = text.split("\n")
        items: tuple[ContextItem, ...] = ()
        if resp.executed and resp.kis and len(full) == len(resp.kis) + 1:  # KI lines + the facet line
            items = tuple(
                ContextItem(
                    id=k.id,
                    line=line.split(". ", 1)[1],
                    compact=serving_context.compact_line(k),
                    doc_ids=tuple(k.evidence_doc_ids),
                )
                for k, line in zip(resp.kis, full, strict=False)
            )
        return ContextObservation(
            text=text,
            doc_ids=docs,
            n_results=len(resp.kis),
            input_tokens=resp.rewrite_tokens.input,
            output_tokens=resp.rewrite_tokens.output,
            items=items,
            facets=full[-1] if items else "",
        )

    return context_fn


def _ensure_corpus(store: CorpusStore, data_dir: Path) -> None:
    docs = load_corpus(data_dir)
    if store.count() < len(docs):
        store.add_documents(docs)


def _questions(
    data: Path, questions_path: Path | None, split: Split, limit: int | None, cfg: KituneConfig
) -> tuple[list[Question], ErrataReport | None]:
    source = questions_path if questions_path else data
    loaded, errata = load_questions_and_errata(source)
    qs = select_split(
        loaded, split, validation_fraction=cfg.optimize.validation_fraction, seed=cfg.optimize.seed
    )
    if loaded and not qs:  # a split too small: say which and why, not "no questions selected"
        raise DataError(
            f"--split {split} of {source} gives 0 questions: its {len(loaded)} question(s) all go to "
            f"{'tuning' if split == 'validation' else 'validation'} (a single question is always a tuning "
            "one); use --split all",
            path=str(source),
        )
    return slice_questions(qs, limit), errata


def _response_text(trace: Trace) -> str:
    """The response the judge graded (:func:`kitune.evaluation.metrics.format_response`), from a trace."""
    conf = "" if trace.confidence is None else f"{trace.confidence}%"
    return f"Explanation: {trace.explanation}\nExact Answer: {trace.exact_answer}\nConfidence: {conf}"


def published_traces(
    traces: Sequence[Trace], published: Sequence[Question], judge: JudgeFn | None
) -> list[Trace]:
    """``traces`` graded against the published labels of the questions an errata overlay corrected.

    Each trace of a question in ``published`` gets that question's gold answer and aliases, EM
    and F1 recomputed, and — when it was graded and a ``judge`` is given — a new verdict against
    the published gold (one judge call per corrected question; an unanswered question stays
    wrong, a failed or ungraded one stays as it was). Every other trace is returned unchanged.

    Args:
        traces: the run's traces (graded against the corrected labels).
        published: the corrected questions as published (:attr:`ErrataReport.published`).
        judge: the run's grader, or None (EM/F1 only; ``judge_correct`` left as it was).
    """
    by_id = {q.query_id: q for q in published}
    out: list[Trace] = []
    for t in traces:
        q = by_id.get(t.query_id)
        if q is None:
            out.append(t)
            continue
        golds = list(q.golds)
        changes: dict[str, Any] = {
            "gold_answer": q.answer,
            "aliases": list(q.aliases),
            "em": exact_match(t.exact_answer, golds),
            "f1": token_f1(t.exact_answer, golds),
        }
        if judge is not None and t.judge_status == "graded":
            if not t.exact_answer.strip():
                changes["judge_correct"] = False
            else:
                verdict = judge(
                    question=t.question, response=_response_text(t), gold=q.answer, aliases=q.aliases
                )
                correct = getattr(verdict, "correct", None)
                if str(getattr(verdict, "status", "graded")) == "graded" and correct is not None:
                    changes["judge_correct"] = bool(correct)
                else:
                    changes["judge_correct"] = None
                    changes["judge_status"] = "grader_error"
                    changes["judge_error"] = str(
                        getattr(verdict, "error", None) or "judge returned no verdict"
                    )
        out.append(replace(t, **changes))
    return out


def _scores(summary: RunSummary) -> dict[str, Any]:
    keys = (
        *("n_total", "n_graded", "n_correct", "accuracy", "ci_low", "ci_high", "em", "f1"),
        *("abstention_total", "abstention_graded", "abstention_correct", "abstention_accuracy"),
    )
    return {k: getattr(summary, k) for k in keys}


def run_eval(
    cfg: KituneConfig,
    *,
    skill: Skill,
    data_dir: Path | str,
    split: Split = "all",
    limit: int | None = None,
    run_name: str | None = None,
    disambiguation: bool = False,
    questions_path: Path | str | None = None,
    concurrency: int | None = None,
    progress: bool = True,
    use_judge: bool = True,
    rewrite: bool = False,
    chat_model: ChatModel | None = None,
    judge: JudgeFn | None = None,
    corpus_store: CorpusStore | None = None,
    context_fn: Callable[[str], ContextObservation] | None = None,
    ledger: TokenLedger | None = None,
    prompt_select: Mapping[str, str] | None = None,
    packaged: bool = False,
    on_trace: Callable[[Trace], None] | None = None,
    on_setting: Callable[[dict[str, str]], None] | None = None,
    no_cache: bool = False,
) -> EvalRunResult:
    """Evaluate one skill on a dataset slice and write the run directory.

    A rerun of the same command resumes its run folder: questions already answered there are
    not asked again (:attr:`EvalRunResult.reused` counts them). ``no_cache`` moves the earlier
    ``traces.jsonl`` aside (``traces.replaced-<UTC time>.jsonl``) and asks every question again.

    Args:
        cfg: configuration (``workdir``, ``agent`` budget/concurrency, ``retrieval`` limits).
        skill: ``baseline``, ``in-context``, ``closed-book`` or ``full-context`` (the question's
            whole conversation in the prompt, one call; judged after all answers).
        data_dir: dataset directory (BrowseComp-Plus layout or documents/questions JSONL).
        split: ``all``, ``tune`` or ``validation`` (seeded by ``cfg.optimize``).
        limit: first N questions of the split.
        run_name: folder under ``<workdir>/runs``; default :func:`default_run_name`.
        disambiguation: in-context only; keep disambiguation KIs in ``get_context`` results.
        questions_path: a questions JSONL overriding the directory's questions.
        concurrency: questions in parallel (default ``cfg.concurrency_for("agent")``: ``agent.concurrency``
            when set, else the embedded server's slots). A full-context run's verdicts, judged after
            the answers, run ``cfg.concurrency_for("judge")`` at once.
        progress: show a progress bar.
        use_judge: grade with the judge (False: ``judge_status="not_run"``).
        rewrite: in-context only; rewrite each look-up with the query rewriter (its tokens are
            recorded as tool tokens). False: the plain plan, no LLM cost.
        chat_model: the agent model (None: ``LiteLLMChatModel(cfg, "agent")``).
        judge: the grader (None: the judge role via :func:`make_judge`).
        corpus_store: the baseline/fallback corpus store (None: ``create_corpus_store(cfg)``,
            filled from ``data_dir`` on first use).
        context_fn: the in-context tool (None: the KI store + ``get_context``).
        ledger: token ledger (None: a fresh one).
        prompt_select: in-context: program → registry version/alias instead of ``production``
            (:func:`kitune.service.serving.prompts.parse_prompt_selection`).
        packaged: in-context: the packaged prompts and their KI table.
        on_trace: called with each finished question's trace (progress output).
        on_setting: called once, before any question runs, with the resolved prompt versions
            (in-context runs that resolve their setting).

        no_cache: move the run folder's earlier ``traces.jsonl`` aside and ask every question again.

    Returns:
        The run's traces (resumed ones included), summary, token usage and prompt versions.

    Raises:
        DataError: bad dataset files. ConfigError: bad skill/config. HarnessError: a skill
        dependency could not be built. PromptNotFoundError: a selected prompt version does not
        exist. LMAuthError: an LLM call was refused for authentication (the run stopped;
        finished traces are kept). Other LMError subclasses only from building the LMs.
    """
    if skill not in EVAL_SKILLS:
        raise ConfigError(f"unknown skill {skill!r}: use one of {', '.join(EVAL_SKILLS)}")
    if (disambiguation or rewrite or prompt_select or packaged) and skill != "in-context":
        raise ConfigError(
            "--disambiguation, --rewrite, --prompt-version and --packaged only apply to --skill in-context"
        )
    data = Path(data_dir)
    if not data.exists():
        raise DataError(missing_data_message(data), path=str(data))
    questions, errata = _questions(data, Path(questions_path) if questions_path else None, split, limit, cfg)
    if not questions:
        raise DataError(f"no questions selected from {data} (split={split}, limit={limit})", path=str(data))
    checksum = dataset_checksum(data, questions_path=questions_path)  # what was read, in every record
    ledger = ledger if ledger is not None else TokenLedger()
    setting = None
    versions: dict[str, str] = {}
    setting_id = None
    if skill == "in-context" and context_fn is None:
        setting = production_setting(cfg, select=prompt_select, packaged=packaged)
        shown = read_programs(rewrite=rewrite)
        versions = {p: v for p, v in setting.versions.items() if p in shown}
        versions["store"] = str(setting_summary(setting)["store"])
        setting_id = "-".join(instruction_version(p, setting.prompts[p]).split("@", 1)[1] for p in shown)
        if on_setting is not None:
            on_setting(dict(versions))
    name = run_name or default_run_name(skill, data, split, limit, disambiguation, setting_id)
    run_dir = Path(cfg.workdir) / "runs" / name
    run_dir.mkdir(parents=True, exist_ok=True)

    if skill in ("baseline", "in-context") and corpus_store is None:
        corpus_store = kitune.retrieval.create_corpus_store(cfg)
        _ensure_corpus(corpus_store, data)
    if setting is not None:
        rewriter = None
        if rewrite:
            rewriter = rewriter_for(
                setting.prompts["rewriter"], kitune.lm.build_lm(cfg, "rewrite", ledger=ledger)
            )
        context_fn = make_context_fn(
            setting.store_cfg,
            kitune.retrieval.create_store(setting.store_cfg),
            disambiguation=disambiguation,
            ledger=ledger,
            rewriter=rewriter,
        )
    if chat_model is None:
        chat_model = kitune.lm.LiteLLMChatModel(cfg, "agent", ledger=ledger)
    if use_judge and judge is None:
        judge = make_judge(cfg, ledger)
    budget = Budget.from_config(cfg.agent)
    model = chat_model

    def factory(q: Question) -> Agent:
        box = build_toolbox(skill, cfg, corpus_store=corpus_store, get_context=context_fn)
        return Agent(model, box, budget=budget, max_output_tokens=cfg.lm.agent.max_tokens)

    agent_factory: AgentFactory = factory
    if skill == FULL_CONTEXT:  # the whole conversation in the prompt, one answer call, no tools
        docs = load_corpus(data)
        agent_factory = full_context_factory(model, docs, max_output_tokens=cfg.lm.agent.max_tokens)

    params = {
        "skill": skill,
        "rewrite": rewrite,
        "disambiguation": disambiguation,
        "data": str(data.resolve()),
        "data_sha256": checksum.sha256,
        "data_files": checksum.files,
        "split": split,
        "limit": limit,
        "question_ids": [q.query_id for q in questions],
        "budget": {
            "max_steps": budget.max_steps,
            "max_tokens": budget.max_tokens,
            "timeout_s": budget.timeout_s,
        },
        "agent_model": cfg.lm.model_label("agent"),
        "judge_model": cfg.lm.model_label("judge") if use_judge else None,
        "grader": cfg.grading.grader if use_judge else None,
        "observation_max_chars": cfg.agent.observation_max_chars,
        "search_hits": cfg.retrieval.search_hits,
        "prompt_versions": versions,
        "tool_calling": getattr(chat_model, "tool_mode", "json"),
    }
    (run_dir / "run.json").write_text(json.dumps(params, indent=2), encoding="utf-8")
    traces_path = run_dir / "traces.jsonl"
    replaced = None
    if no_cache and traces_path.exists():
        replaced = run_dir / f"traces.replaced-{utcnow().strftime('%Y%m%dT%H%M%S%fZ')}.jsonl"
        traces_path.replace(replaced)
    answered_before = _answered_ids(traces_path)
    with ledger.stage(f"eval:{skill}"):
        # full-context is judged after all answers: a judge call in between would evict the
        # conversation from the local server's prompt cache.
        judge_after = skill == FULL_CONTEXT and use_judge and judge is not None
        traces = evaluate(
            questions,
            agent_factory,
            skill=skill,
            concurrency=concurrency or cfg.concurrency_for("agent"),
            traces_path=traces_path,
            judge=judge if use_judge and not judge_after else None,
            progress=progress,
            on_trace=on_trace,
        )
        if judge_after and judge is not None:
            traces = judge_pending(
                questions, traces, judge, traces_path=traces_path, concurrency=cfg.concurrency_for("judge")
            )
    with_adversarial = cfg.grading.include_adversarial
    summary = summarize(traces, name, data_sha256=checksum.sha256, include_adversarial=with_adversarial)
    # the score on the labels as published beside the corrected one (errata overlay, if any)
    published = published_traces(traces, errata.published if errata else (), judge if use_judge else None)
    published_summary = summarize(
        published, f"{name}-published", data_sha256=checksum.sha256, include_adversarial=with_adversarial
    )
    scores = {
        "corrected": _scores(summary),
        "published": _scores(published_summary),
        "errata": None
        if errata is None
        else {
            "path": errata.path,
            "applied": [q for q in errata.applied if q in {t.query_id for t in traces}],
            "unmatched": list(errata.unmatched),
            "mismatched": list(errata.mismatched),
        },
        "adversarial_in_headline": with_adversarial,
    }
    usage = {f"{r}/{s}": t for (r, s), t in ledger.by_role_stage().items()}
    (run_dir / "summary.json").write_text(json.dumps(summary.to_dict(), indent=2), encoding="utf-8")
    (run_dir / "scores.json").write_text(json.dumps(scores, indent=2), encoding="utf-8")
    (run_dir / "usage.json").write_text(json.dumps(usage, indent=2), encoding="utf-8")
    return EvalRunResult(
        run_dir=run_dir,
        traces_path=traces_path,
        traces=traces,
        summary=summary,
        usage=usage,
        prompt_versions=versions,
        reused=sum(1 for t in traces if t.query_id in answered_before and t.status != "failed"),
        replaced=replaced,
        published_summary=published_summary,
        errata=errata,
    )


def _answered_ids(traces_path: Path) -> set[str]:
    """Question ids a run folder's ``traces.jsonl`` already holds an answer for (status not ``failed``)."""
    if not traces_path.is_file():
        return set()
    out: set[str] = set()
    for line in traces_path.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # a line cut by a crash: the resume skips it too
        if isinstance(rec, dict) and rec.get("status") != "failed" and isinstance(rec.get("query_id"), str):
            out.add(rec["query_id"])
    return out


def report_runs(run_paths: Sequence[Path | str], out_dir: Path | str) -> ReportFiles:
    """Read runs (directories with ``traces.jsonl``, or trace files) and write the side-by-side report.

    Raises:
        DataError: a run has no traces. HarnessError: two runs share a name.
    """
    runs: dict[str, list[Trace]] = {}
    graders: dict[str, str | None] = {}
    for p in run_paths:
        name, traces = load_run(p)
        if name in runs:
            raise HarnessError(f"two runs are named {name!r}: pass distinct run directories")
        runs[name] = traces
        graders[name] = run_grader(p)
    return write_report(runs, out_dir, graders=graders)
