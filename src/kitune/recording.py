"""Record every LLM call of a run, and replay it offline (``--record DIR`` / ``--replay DIR``).

With ``lm.record_dir`` set (``--record DIR``), every :class:`kitune.lm.KituneLM` call — DSPy
programs (extractor, rewriter, judge, reflection) and the eval agent's chat calls alike, since
both go through ``KituneLM.forward`` — is appended to ``DIR/calls.jsonl``, one JSON line per
call::

    {"v": 1, "hash": "<sha256 of model + messages + parameters>", "role": "agent",
     "model": "openai/gpt-4o-mini", "stage": "eval:baseline", "request": {"n_messages": 5,
     "last": "<first 300 chars of the last message>", "params": {...}}, "response": {<LiteLLM
     ModelResponse>}, "usage": {"input_tokens", "output_tokens", "estimated", "cache_hit"},
     "finish_reason": "stop", "latency_s": 1.42, "ledger": [<every attempt's ledger record>],
     "downgrades": ["json_schema->json_object"], "error": null}

A failed call is stored with ``"error": {"type": "LMTimeoutError", "message": ..., ...}`` and
re-raised as the same kitune error on replay. With ``lm.replay_dir`` set (``--replay DIR``) no
provider is contacted (no key, no gateway, no local model server is needed): each call is
answered from the recording with the same hash — the n-th identical request gets the n-th
recorded answer — its ledger records (tokens, failed attempts, cache hits) are replayed into
the run's ledger, response-format downgrades are re-applied, and the recorded latency is
reported so the agent's wall-clock budget sees the recorded time. A request with no recording
raises :class:`RecordingMissError` naming the role, model, stage, hash and the start of the
last message, and is kept in :attr:`CallRecorder.misses` so the command fails at the end even
where a caller treats the error as data (one failed question, one grader error).

The hash covers the model as configured (the gateway's model name, or ``openai/<local model>``
for the embedded one), every message and every request parameter except the endpoint, key,
``cache`` and streaming flags; so a replay needs the same config and prompts, and anything else
is a miss. Record into an empty DIR in one invocation for an exact replay (a resumed recording
appends, and the replay serves identical requests in recorded order).
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import kitune.errors as kerrors
from kitune.errors import ConfigError, DataError, LMError
from kitune.usage import current_stage

__all__ = [
    "CALLS_FILE",
    "CallRecorder",
    "Capture",
    "RecordMode",
    "RecordingMissError",
    "capture",
    "find_recorder",
    "get_recorder",
    "rebuild_error",
    "request_hash",
    "reset_recorders",
]

logger = logging.getLogger(__name__)

CALLS_FILE = "calls.jsonl"
"""The recording's file name inside the record/replay directory."""

RecordMode = Literal["record", "replay"]

_FORMAT_VERSION = 1
_EXCLUDED_PARAMS = ("cache", "_kitune_refresh", "stream", "stream_options", "num_retries")


class RecordingMissError(ConfigError):
    """A replayed run made an LLM call the recording does not hold.

    Attributes:
        hash: the request hash (see :func:`request_hash`).
        role: the LM role that made the call.
    """

    def __init__(self, message: str, *, hash: str, role: str) -> None:
        super().__init__(message)
        self.hash = hash
        self.role = role


def request_hash(model: str, messages: list[dict[str, Any]], params: dict[str, Any]) -> str:
    """SHA-256 (hex) of the canonical JSON of ``model``, ``messages`` and ``params``.

    ``params`` keys in :data:`_EXCLUDED_PARAMS` and ``api_*`` are left out; keys are sorted, so the
    same request always hashes the same.
    """
    kept = {k: v for k, v in params.items() if k not in _EXCLUDED_PARAMS and not k.startswith("api_")}
    blob = json.dumps(
        {"model": model, "messages": messages, "params": kept},
        sort_keys=True,
        ensure_ascii=False,
        default=str,
    )
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


@dataclass
class Capture:
    """What one recorded call did besides returning: its ledger records and format downgrades."""

    ledger: list[dict[str, Any]] = field(default_factory=list)
    downgrades: list[str] = field(default_factory=list)


_CAPTURE: contextvars.ContextVar[Capture | None] = contextvars.ContextVar("kitune_capture", default=None)


def capture() -> Capture | None:
    """The capture of the call being recorded in this thread/task, or None (not recording)."""
    return _CAPTURE.get()


def _last_text(messages: list[dict[str, Any]]) -> str:
    if not messages:
        return ""
    content = messages[-1].get("content")
    text = content if isinstance(content, str) else json.dumps(content, default=str)
    return " ".join((text or "").split())[:300]


def _error_entry(err: LMError) -> dict[str, Any]:
    attrs = {
        k: v
        for k, v in vars(err).items()
        if isinstance(v, str | int | float | bool | type(None)) and k != "args"
    }
    return {"type": type(err).__name__, "message": str(err), "attrs": attrs}


def rebuild_error(entry: dict[str, Any]) -> LMError:
    """The kitune error a recorded failed call raised (same class, message and attributes)."""
    cls = getattr(kerrors, str(entry.get("type", "")), None)
    if not (isinstance(cls, type) and issubclass(cls, LMError)):
        cls = LMError
    err = cls.__new__(cls)
    Exception.__init__(err, entry.get("message", ""))
    for k, v in (entry.get("attrs") or {}).items():
        setattr(err, k, v)
    return err


class CallRecorder:
    """One recording directory, shared by every LM of the process (thread-safe).

    Args:
        directory: the record/replay folder (created when recording).
        mode: ``record`` (append every call) or ``replay`` (answer from the file).

    Attributes:
        misses: one line per unrecorded call seen while replaying (empty when all were found).
        recorded: calls appended while recording.
        replayed: calls answered from the file.

    Raises:
        DataError: replay mode and ``DIR/calls.jsonl`` is missing or holds a malformed line.
    """

    def __init__(self, directory: Path, mode: RecordMode) -> None:
        self.directory = Path(directory)
        self.mode: RecordMode = mode
        self.path = self.directory / CALLS_FILE
        self.misses: list[str] = []
        self.recorded = 0
        self.replayed = 0
        self._lock = threading.Lock()
        self._entries: dict[str, list[dict[str, Any]]] = {}
        self._served: dict[str, int] = {}
        if mode == "replay":
            if not self.path.is_file():
                raise DataError(
                    f"--replay {self.directory}: no {CALLS_FILE} there; pass the folder a `--record DIR` run "
                    "wrote",
                    path=str(self.path),
                )
            self._load()

    def _load(self) -> None:
        with self.path.open(encoding="utf-8") as fh:
            for n, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    entry = json.loads(line)
                    self._entries.setdefault(str(entry["hash"]), []).append(entry)
                except (ValueError, KeyError, TypeError) as e:
                    raise DataError(
                        f"{self.path} line {n} is not a recorded call ({e}): re-record with --record",
                        path=str(self.path),
                        line=n,
                    ) from e

    @property
    def size(self) -> int:
        """Recorded calls available (replay) or written (record)."""
        return sum(len(v) for v in self._entries.values()) if self.mode == "replay" else self.recorded

    def lookup(self, digest: str, *, role: str, model: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
        """The next recorded entry for ``digest`` (replay mode).

        Raises:
            RecordingMissError: nothing (more) is recorded for this request.
        """
        with self._lock:
            entries = self._entries.get(digest, [])
            served = self._served.get(digest, 0)
            if served < len(entries):
                self._served[digest] = served + 1
                self.replayed += 1
                return entries[served]
            same_role = sum(1 for v in self._entries.values() for e in v if e.get("role") == role)
            what = "no recording" if not entries else f"only {len(entries)} recording(s) of this request"
            message = (
                f"replay of {self.directory}: {what} for the {role} call to {model} in stage "
                f"{current_stage()!r} (request {digest[:12]}, {len(messages)} message(s), last: "
                f"{_last_text(messages)[:120]!r}). The recording holds {same_role} {role} call(s): the "
                f"config, prompts or data differ from the recorded run. {self._miss_hint()}"
            )
            self.misses.append(message)
        # debug, not error: the raised error (or the command's end-of-run report) shows it once
        logger.debug("%s", message)
        raise RecordingMissError(message, hash=digest, role=role)

    def _miss_hint(self) -> str:
        """What to do about a miss: the config stored with the recording, if its folder has one."""
        for folder in (self.directory, self.directory.parent):
            configs = sorted(p for p in folder.glob("*.*") if p.suffix.lower() in {".yaml", ".yml", ".toml"})
            if configs:
                return (
                    f"Replay with the config stored next to the recording (--config {configs[0]}) and the "
                    "same data, or re-record with --record DIR."
                )
        return "Replay with the recorded run's --config and data, or re-record with --record DIR."

    def append(self, entry: dict[str, Any]) -> None:
        """Write one call (record mode): one JSON line, flushed."""
        line = json.dumps({"v": _FORMAT_VERSION, **entry}, ensure_ascii=False, default=str) + "\n"
        with self._lock:
            self.directory.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as fh:
                fh.write(line)
                fh.flush()
            self.recorded += 1

    def record_call(
        self,
        *,
        digest: str,
        role: str,
        model: str,
        messages: list[dict[str, Any]],
        params: dict[str, Any],
        run: Any,
        started: float,
        clock: Any,
    ) -> Any:
        """Run ``run()`` (the real call) under a capture and append what happened.

        Returns:
            What ``run()`` returned (a LiteLLM ``ModelResponse``).

        Raises:
            LMError: re-raised from ``run()`` after being recorded.
        """
        cap = Capture()
        token = _CAPTURE.set(cap)
        entry: dict[str, Any] = {
            "hash": digest,
            "role": role,
            "model": model,
            "stage": current_stage(),
            "request": {
                "n_messages": len(messages),
                "last": _last_text(messages),
                "params": {k: v for k, v in params.items() if k not in ("messages",)},
            },
        }
        try:
            response = run()
        except LMError as e:
            entry.update(
                response=None,
                usage=None,
                finish_reason=None,
                latency_s=round(clock() - started, 4),
                ledger=cap.ledger,
                downgrades=cap.downgrades,
                error=_error_entry(e),
            )
            self.append(entry)
            raise
        finally:
            _CAPTURE.reset(token)
        usage = dict(response._hidden_params.get("kitune_usage") or {})
        choices = getattr(response, "choices", None) or []
        latency = round(clock() - started, 4)
        # The caller sees the latency exactly as stored, so a replay reports the same number.
        response._hidden_params["kitune_usage"] = {**usage, "recorded_latency_s": latency}
        entry.update(
            response=response.model_dump(),
            usage={k: v for k, v in usage.items() if k != "recorded_latency_s"},
            finish_reason=getattr(choices[0], "finish_reason", None) if choices else None,
            latency_s=latency,
            ledger=cap.ledger,
            downgrades=cap.downgrades,
            error=None,
        )
        self.append(entry)
        return response


_RECORDERS: dict[tuple[str, str], CallRecorder] = {}
_RECORDERS_LOCK = threading.Lock()


def get_recorder(directory: Path | str | None, mode: RecordMode) -> CallRecorder | None:
    """The process-wide recorder for ``directory`` in ``mode`` (None when ``directory`` is None).

    Raises:
        DataError: see :class:`CallRecorder`.
    """
    if directory is None:
        return None
    key = (str(Path(directory).resolve()), mode)
    with _RECORDERS_LOCK:
        rec = _RECORDERS.get(key)
        if rec is None:
            rec = CallRecorder(Path(directory), mode)
            _RECORDERS[key] = rec
        return rec


def find_recorder(directory: Path | str, mode: RecordMode) -> CallRecorder | None:
    """The recorder :func:`get_recorder` made for ``directory`` in ``mode``, or None (none made yet)."""
    with _RECORDERS_LOCK:
        return _RECORDERS.get((str(Path(directory).resolve()), mode))


def reset_recorders() -> None:
    """Forget every recorder (tests; a new run in the same process re-reads the files)."""
    with _RECORDERS_LOCK:
        _RECORDERS.clear()
