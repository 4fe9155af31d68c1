"""LM test doubles: ``DummyLM`` (re-exported from DSPy), :class:`ReplayLM` and :func:`mock_usage_lm`.

* :class:`ReplayLM` answers from a JSON file of recorded completions keyed by the request's
  messages, so programs run end to end offline and deterministically. With ``RECORD_LM=1`` in
  the environment (or ``record_with=`` given) unseen requests go through the real LM layer and
  are written to the file. Each reply reports fixed usage, so ledger tests have numbers.
* :func:`mock_usage_lm` is a real :class:`kitune.lm.KituneLM` whose calls are answered by
  LiteLLM's ``mock_response`` (no network; LiteLLM reports 10 prompt / 20 completion tokens).
"""

from __future__ import annotations

import json
import os
import threading
import warnings
from pathlib import Path
from typing import Any

import dspy
from dspy.utils.dummies import DummyLM

from kitune.errors import ConfigError, DataError, KituneError
from kitune.lm import KituneLM, ResolvedLM
from kitune.usage import CallRecord, TokenLedger, current_stage

__all__ = ["DummyLM", "ReplayLM", "ReplayMissError", "mock_usage_lm", "replay_key", "stub_server_lm"]

# ReplayLM overrides forward() (dspy 3.4 warns that interface goes away in 3.5); see kitune.lm.
warnings.filterwarnings(
    "ignore", message="Implementing custom LMs through BaseLM.forward", category=DeprecationWarning
)

_FORMAT_VERSION = 1
_KEY_KWARGS = ("n", "rollout_id")
"""Request kwargs besides the messages that change what a replay should return."""


def replay_key(messages: list[dict[str, Any]], kwargs: dict[str, Any] | None = None) -> str:
    """The replay key: sorted-keys ``json.dumps`` of the messages (plus ``n``/``rollout_id``).

    Deterministic: the same request always gives the same key.
    """
    data: dict[str, Any] = {"messages": messages}
    for name in _KEY_KWARGS:
        if kwargs and kwargs.get(name) is not None:
            data[name] = kwargs[name]
    return json.dumps(data, sort_keys=True, ensure_ascii=False)


class ReplayMissError(KituneError):
    """A :class:`ReplayLM` got a request it has no recording for.

    Attributes:
        key: the replay key that was missing (see :func:`replay_key`).
        path: the replay file.
    """

    def __init__(self, key: str, path: Path) -> None:
        super().__init__(
            f"no recorded completion in {path} for key:\n{key}\n"
            "Record it with RECORD_LM=1 (and ReplayLM(..., record_with=build_lm(cfg, role))), "
            "or add the entry to the file by hand."
        )
        self.key = key
        self.path = path


class ReplayLM(dspy.LM):  # type: ignore[misc]
    """A ``dspy.LM`` that replays recorded completions from a JSON file.

    File shape: ``{"version": 1, "entries": {<key>: {"text": str, "usage": [in, out]}}}``.

    Args:
        path: the replay file (created on the first recording).
        record_with: an LM (usually :func:`kitune.lm.build_lm`) used to record misses. With
            ``RECORD_LM=1`` set, a miss without ``record_with`` raises ``ConfigError``.
        usage: ``(input_tokens, output_tokens)`` reported for entries recorded without usage.
        ledger: when given, each replayed call is recorded under ``role`` and the current stage.
        role: the ledger role.
        fail_under_pytest: on a miss inside a pytest test, call ``pytest.fail`` (a clear test
            failure showing the key) instead of raising :class:`ReplayMissError`.

    Raises:
        DataError: the file exists but is not a replay file.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        record_with: dspy.BaseLM | None = None,
        usage: tuple[int, int] = (100, 20),
        ledger: TokenLedger | None = None,
        role: str = "extract",
        fail_under_pytest: bool = True,
        model: str = "openai/replay",
    ) -> None:
        super().__init__(model=model, cache=False, num_retries=0)
        self.path = Path(path)
        self.record_with = record_with
        self.default_usage = usage
        self.ledger = ledger
        self.role = role
        self.fail_under_pytest = fail_under_pytest
        self.misses: list[str] = []
        self._lock = threading.Lock()
        self._entries: dict[str, dict[str, Any]] = self._load()

    def _load(self) -> dict[str, dict[str, Any]]:
        if not self.path.exists():
            return {}
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            entries = data["entries"]
            if not isinstance(entries, dict):
                raise TypeError("entries is not a mapping")
        except (ValueError, KeyError, TypeError) as e:
            raise DataError(
                f"{self.path} is not a ReplayLM file ({e}): expected "
                '{"version": 1, "entries": {...}}; delete it to re-record',
                path=str(self.path),
            ) from e
        return entries

    def _save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        tmp.write_text(
            json.dumps(
                {"version": _FORMAT_VERSION, "entries": self._entries},
                indent=1,
                sort_keys=True,
                ensure_ascii=False,
            ),
            encoding="utf-8",
        )
        os.replace(tmp, self.path)

    @property
    def supported_params(self) -> set[str]:
        """Empty: adapters send no ``response_format``, so keys do not depend on capabilities."""
        return set()

    @property
    def supports_response_schema(self) -> bool:
        """False (see :attr:`supported_params`)."""
        return False

    def _record_miss(
        self, key: str, messages: list[dict[str, Any]], kwargs: dict[str, Any]
    ) -> dict[str, Any]:
        recorder = self.record_with
        if recorder is None:
            raise ConfigError(
                "RECORD_LM=1 is set but ReplayLM has no record_with LM: pass "
                "ReplayLM(path, record_with=build_lm(cfg, role)) to record"
            )
        response = recorder.forward(messages=messages, **kwargs)
        text = response.choices[0].message.content or ""
        hidden = getattr(response, "_hidden_params", {}) or {}
        usage = hidden.get("kitune_usage")
        if usage:
            pair = [int(usage["input_tokens"]), int(usage["output_tokens"])]
        else:
            u = getattr(response, "usage", None)
            pair = [int(getattr(u, "prompt_tokens", 0) or 0), int(getattr(u, "completion_tokens", 0) or 0)]
        entry = {"text": text, "usage": pair}
        with self._lock:
            self._entries[key] = entry
            self._save()
        return entry

    def forward(
        self, prompt: str | None = None, messages: list[dict[str, Any]] | None = None, **kwargs: Any
    ) -> Any:
        """Return the recorded completion as a LiteLLM ``ModelResponse``.

        Raises:
            ReplayMissError: no recording and not recording (``pytest.fail`` under pytest).
        """
        import litellm

        msgs = list(messages) if messages else [{"role": "user", "content": prompt or ""}]
        kwargs = {k: v for k, v in kwargs.items() if k != "cache"}
        key = replay_key(msgs, kwargs)
        with self._lock:
            entry = self._entries.get(key)
        if entry is None:
            if self.record_with is not None or os.environ.get("RECORD_LM") == "1":
                entry = self._record_miss(key, msgs, kwargs)
            else:
                self.misses.append(key)
                err = ReplayMissError(key, self.path)
                if self.fail_under_pytest and "PYTEST_CURRENT_TEST" in os.environ:
                    import pytest

                    pytest.fail(str(err), pytrace=False)
                raise err
        usage = entry.get("usage") or list(self.default_usage)
        if self.ledger is not None:
            self.ledger.record(
                CallRecord(
                    role=self.role,
                    stage=current_stage(),
                    model=self.model,
                    input_tokens=int(usage[0]),
                    output_tokens=int(usage[1]),
                )
            )
        return litellm.ModelResponse(
            model=self.model,
            choices=[
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": entry["text"]},
                }
            ],
            usage={
                "prompt_tokens": int(usage[0]),
                "completion_tokens": int(usage[1]),
                "total_tokens": int(usage[0]) + int(usage[1]),
            },
        )

    async def aforward(
        self, prompt: str | None = None, messages: list[dict[str, Any]] | None = None, **kwargs: Any
    ) -> Any:
        """Async :meth:`forward`."""
        return self.forward(prompt, messages, **kwargs)


def mock_usage_lm(
    content: str = "ok",
    *,
    role: str = "extract",
    ledger: TokenLedger | None = None,
    model: str = "openai/mock-model",
) -> Any:
    """A :class:`kitune.lm.KituneLM` answered by LiteLLM's ``mock_response`` (no network).

    Every call returns ``content`` and reports LiteLLM's fixed mock usage (10 prompt, 20
    completion tokens), recorded in ``ledger`` under ``role`` like a real call.
    """
    resolved = ResolvedLM(
        role=role,
        model=model,
        api_base=None,
        api_key="sk-mock",
        key_env=None,
        base_env=None,
        is_local=False,
        temperature=0.0,
        max_tokens=256,
        timeout_s=10.0,
        num_retries=0,
    )
    return KituneLM(resolved, ledger=ledger, mock_response=content)


def stub_server_lm(
    base_url: str,
    *,
    role: str = "extract",
    max_tokens: int = 512,
    is_local: bool = False,
    model: str = "openai/stub",
    api_key: str = "sk-test",
    ledger: TokenLedger | None = None,
) -> KituneLM:
    """A :class:`kitune.lm.KituneLM` that calls a :class:`~kitune.testing.openai_stub.StubServer`.

    The whole real transport (adapters, response_format ladder, finish reasons, ledger) runs
    against the stub: temperature 0, a 5 s timeout, no retries (a test scripts every reply).

    Args:
        base_url: the stub's ``base_url`` (``http://127.0.0.1:<port>/v1``).
        role: the LM role the calls are recorded under.
        max_tokens: the completion cap sent with each request.
        is_local: True to be treated as the embedded local server (its JSON-object schema format).
        model: the LiteLLM model name (``openai/…`` routes to the stub).
        api_key: the bearer token sent.
        ledger: token ledger the calls are recorded in (None: none).
    """
    resolved = ResolvedLM(
        role=role,
        model=model,
        api_base=base_url,
        api_key=api_key,
        key_env=None,
        base_env=None,
        is_local=is_local,
        temperature=0.0,
        max_tokens=max_tokens,
        timeout_s=5.0,
        num_retries=0,
    )
    return KituneLM(resolved, ledger=ledger)
