"""The loop's store-state-aware evaluation cache: traces and look-ups keyed by setting and KI store state.

An evaluation of a setting is cached under ``<state>/evals/<setting eval key>-<config
key>-<store fingerprint>.jsonl`` (:func:`eval_config_key` names the configuration an agent's
answers depend on beyond the setting, :func:`store_fingerprint` the KI store's content), and every
``get_context`` call the agent made is logged (query, SHA-256 of the observation text, KI ids
shown; :func:`lookup_record`) to ``<state>/evals/observations.jsonl``. When the store changed
since a question's last trace for the setting, :meth:`EvalCache.reuse_unaffected` replays its
look-ups against the store as it is now: if every observation is identical, the agent
(deterministic at temperature 0) would see exactly what it saw before, so the trace is reused
(every earlier state of the question is tried, newest first: after the gate retired a KI, the
state before it was written matches again). :meth:`EvalCache.lookup_changes` replays the same
log to tell the feedback gate which questions' KI ids a write changed.
:class:`~kitune.service.tuning.loop_env.ServiceLoopEnv` owns one :class:`EvalCache`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kitune.evaluation.harness import TraceWriter, read_traces
from kitune.schema import Filter

if TYPE_CHECKING:
    from kitune.config import KituneConfig
    from kitune.data.loaders import Question
    from kitune.evaluation.metrics import Trace
    from kitune.retrieval.base import Store

__all__ = ["EVAL_CONFIG_FIELDS", "EvalCache", "eval_config_key", "lookup_record", "store_fingerprint"]

_KI_ID = re.compile(r"^\d+\. \[([^\]]+)\]", re.MULTILINE)
"""A KI id as ``render_context`` shows it: ``1. [ki-…] title — …``."""


EVAL_CONFIG_FIELDS: dict[str, tuple[str, ...] | None] = {
    "agent": None,
    "retrieval": None,
    "grading": None,
    "embedder": None,
    "lm.agent": ("model", "temperature", "max_tokens"),
    "lm.judge": ("model", "temperature", "max_tokens"),
}
"""Config sections (None: every field) an evaluation's answers depend on besides the setting:
the agent's loop bounds, ``max_tokens``, call rules, rendering and de-duplication, tool calling;
the retrieval sizes and caps; the grader; the embedder; the agent's and the judge's model."""

_EVAL_CONFIG_IGNORED = {"agent": ("concurrency",)}
"""Fields that change how fast an evaluation runs, not what it answers."""


def eval_config_key(cfg: KituneConfig) -> str:
    """8 hex characters naming the :data:`EVAL_CONFIG_FIELDS` of ``cfg``.

    Changing any of them (a loop bound, ``agent.max_tokens``, ``agent.call_rules``,
    ``agent.ki_render`` …) gives new cache files, so a resumed run never reuses answers given under
    other agent settings. A model chosen by environment variable rather than in the config is not seen here.
    """
    parts: dict[str, Any] = {}
    for dotted, fields in EVAL_CONFIG_FIELDS.items():
        section: Any = cfg
        for name in dotted.split("."):
            section = getattr(section, name)
        dumped = section.model_dump(mode="json")
        keep = fields if fields is not None else tuple(dumped)
        skip = _EVAL_CONFIG_IGNORED.get(dotted, ())
        parts[dotted] = {k: dumped[k] for k in keep if k not in skip}
    blob = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:8]


def store_fingerprint(store: Store) -> str:
    """16 hex characters identifying the KI store's content: ids, statuses, titles, descriptions.

    Content-addressed, so it is the same for the same KIs in any store instance, process or
    folder (a rerun and a ``--replay`` find their cached evaluations), and changes whenever a KI
    is written, changed, expired or deleted; the order of KIs does not matter. It reads every KI
    (a few thousand at loop scale: milliseconds; ``Store.fingerprint()`` is the cheap
    write-version alternative, but it names the store's folder and so differs between runs).
    """
    rows = sorted(
        f"{k.id}\t{k.payload.status}\t{k.title}\t{k.description}" for k in store.iter_kis(Filter(statuses=()))
    )
    return hashlib.sha256("\n".join(rows).encode("utf-8")).hexdigest()[:16]


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def lookup_record(query: str, text: str) -> dict[str, Any]:
    """One logged ``get_context`` call: ``{"query", "sha" (16 hex of the text), "ki_ids" shown}``."""
    return {"query": query, "sha": _sha(text), "ki_ids": _KI_ID.findall(text)}


class EvalCache:
    """Evaluation traces and the look-up log of one loop state folder.

    Args:
        evals_dir: ``<workdir>/optimize/<run name>/evals``.
        lock: serialises writes to the look-up log (the environment's own lock).
    """

    def __init__(self, evals_dir: Path, lock: threading.RLock) -> None:
        self.evals_dir = evals_dir
        self.lock = lock

    @property
    def obs_path(self) -> Path:
        """``<evals>/observations.jsonl``: one line per evaluated question and store state."""
        return self.evals_dir / "observations.jsonl"

    def traces_path(self, key: str, state: str) -> Path:
        """``<evals>/<setting eval key>-<store state>.jsonl``."""
        return self.evals_dir / f"{key}-{state}.jsonl"

    def log_observations(self, key: str, state: str, query_id: str, calls: list[dict[str, Any]]) -> None:
        """Append the look-ups (:func:`lookup_record` dicts) question ``query_id`` made (fsynced)."""
        line = json.dumps(
            {"setting": key, "store": state, "query_id": query_id, "calls": calls}, ensure_ascii=False
        )
        self.obs_path.parent.mkdir(parents=True, exist_ok=True)
        with self.lock, self.obs_path.open("a", encoding="utf-8") as fh:
            fh.write(line + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def observations(self, key: str) -> dict[tuple[str, str], list[dict[str, Any]]]:
        """(store state, query id) → look-ups logged for setting ``key`` (later lines win)."""
        out: dict[tuple[str, str], list[dict[str, Any]]] = {}
        if not self.obs_path.is_file():
            return out
        for line in self.obs_path.read_text(encoding="utf-8").splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:  # a crash mid-write leaves at most one bad last line
                continue
            if rec.get("setting") == key:
                out[(rec["store"], rec["query_id"])] = rec["calls"]
        return out

    def reuse_unaffected(
        self,
        key: str,
        questions: Sequence[Question],
        state: str,
        path: Path,
        context_fn: Callable[[], Callable[[str], Any]],
    ) -> tuple[int, set[str]]:
        """Copy into ``path`` the earlier traces whose look-ups return the same observations now.

        Args:
            key: the setting's eval key.
            questions: the questions of the split being evaluated.
            state: the store state now (:func:`store_fingerprint`).
            path: the traces file of ``key`` and ``state``.
            context_fn: builds the setting's ``get_context`` on the store as it is now (called
                only when an earlier trace exists).

        Returns:
            ``(how many traces were reused, query ids with a usable trace in path now)``.
        """
        have = {t.query_id for t in read_traces(path) if t.status != "failed"}
        todo = [q for q in questions if q.query_id not in have]
        if not todo:
            return 0, have
        obs = self.observations(key)
        earlier: dict[str, list[tuple[Trace, list[dict[str, Any]]]]] = {}
        newest_first = sorted(
            self.evals_dir.glob(f"{key}-*.jsonl"), key=lambda x: x.stat().st_mtime, reverse=True
        )
        for f in newest_first:
            old_state = f.stem[len(key) + 1 :]  # the key itself holds a "-" (<eval key>-<config key>)
            if old_state == state:
                continue
            for t in read_traces(f):
                calls = obs.get((old_state, t.query_id))
                if t.status != "failed" and calls is not None:
                    earlier.setdefault(t.query_id, []).append((t, calls))
        if not earlier:
            return 0, have
        get_context = context_fn()
        texts: dict[str, str] = {}

        def sha_now(query: str) -> str:  # one look-up per distinct query, however many states are tried
            if query not in texts:
                texts[query] = _sha(get_context(query).text)
            return texts[query]

        writer: TraceWriter | None = None
        reused = 0
        for q in todo:
            for trace, calls in earlier.get(q.query_id, []):
                if all(sha_now(c["query"]) == c["sha"] for c in calls):
                    writer = writer or TraceWriter(path)
                    writer.write(trace)
                    self.log_observations(key, state, q.query_id, calls)
                    have.add(q.query_id)
                    reused += 1
                    break
        return reused, have

    def lookup_changes(
        self,
        key: str,
        before_state: str,
        query_ids: Sequence[str],
        get_context: Callable[[str], Any],
    ) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
        """KI ids the logged look-ups of ``query_ids`` showed at ``before_state``, and what they show now.

        Args:
            key: the setting's eval key.
            before_state: the store state the look-ups were logged at.
            query_ids: the questions to replay (those without a log at ``before_state`` are left out).
            get_context: the setting's ``get_context`` on the store as it is now (returns an
                observation with ``.text``).

        Returns:
            ``(before, after)``: query id → KI ids of all its look-ups in order (the gate's
            :func:`kitune.optimizers.gate.attribute_changes` input). A query asked by several
            questions is replayed once.
        """
        obs = self.observations(key)
        shown: dict[str, list[str]] = {}
        before: dict[str, list[str]] = {}
        after: dict[str, list[str]] = {}
        for qid in query_ids:
            calls = obs.get((before_state, qid))
            if calls is None:
                continue
            before[qid] = [k for c in calls for k in c["ki_ids"]]
            now: list[str] = []
            for c in calls:
                if c["query"] not in shown:
                    shown[c["query"]] = lookup_record(c["query"], get_context(c["query"]).text)["ki_ids"]
                now.extend(shown[c["query"]])
            after[qid] = now
        return before, after
