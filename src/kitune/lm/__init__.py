"""The LM layer: the ONLY package that builds ``dspy.LM`` objects and names LiteLLM model strings.

Flow: :func:`resolve_role` turns the config of one role into a :class:`ResolvedLM` (model string,
base URL, key) and validates it before any network call; :func:`build_lm` wraps that in a
:class:`KituneLM`, a ``dspy.LM`` that owns timeouts, bounded retries, error classification,
the ``response_format`` ladder, the response cache and the token ledger.

Modules, one job each:

* :mod:`kitune.lm.roles` — role resolution (config + env vars → :class:`ResolvedLM`; offline/replay);
* :mod:`kitune.lm.errors` — :func:`classify_error`, :func:`parse_retry_after`;
* :mod:`kitune.lm.formats` — the response_format ladder and :func:`reset_format_memory`;
* :mod:`kitune.lm.calls` — :func:`track_calls`, :func:`track_replies`, :func:`track_parse_counts`,
  :func:`finish_reason_of`;
* :mod:`kitune.lm.client` — :class:`KituneLM` and :func:`build_lm`;
* :mod:`kitune.lm.adapters` — the adapters, whose ``parse`` is lenient (a record list read per
  record, typed values such as ``int[90]`` read, the first JSON object anywhere), :func:`adapter_for`,
  :func:`default_adapter`;
* :mod:`kitune.lm.replies` — reading JSON out of real replies (:func:`extract_json`, :func:`read_records`,
  :func:`repair_surrogates`);
* :mod:`kitune.lm.chat_model` — :class:`LiteLLMChatModel`, the agent's tool-calling chat model.

Import from ``kitune.lm`` (this package); callers and tests patch names here
(``monkeypatch.setattr(kitune.lm, "build_lm", ...)``) because every caller imports them from
``kitune.lm`` at call time.
"""

from __future__ import annotations

from kitune.lm.adapters import (
    KituneChatAdapter,
    KituneJSONAdapter,
    LocalJSONAdapter,
    ReplyParseError,
    adapter_for,
    default_adapter,
    parse_leniently,
    record_list_field,
    typed_value,
    unwrap_typed,
)
from kitune.lm.calls import CallOutcome, finish_reason_of, track_calls, track_parse_counts, track_replies
from kitune.lm.chat_model import LiteLLMChatModel
from kitune.lm.client import KituneLM, build_lm
from kitune.lm.errors import classify_error, parse_retry_after
from kitune.lm.formats import FORMAT_LEVELS, reset_format_memory
from kitune.lm.replies import (
    REPLY_FAILURES,
    RecordError,
    Records,
    extract_json,
    find_json_object,
    read_json_object,
    read_records,
    record_error,
    repair_surrogates,
    reply_failure,
    strip_reasoning,
)
from kitune.lm.roles import ResolvedLM, resolve_role

__all__ = [
    "FORMAT_LEVELS",
    "REPLY_FAILURES",
    "CallOutcome",
    "KituneChatAdapter",
    "KituneJSONAdapter",
    "KituneLM",
    "LiteLLMChatModel",
    "LocalJSONAdapter",
    "RecordError",
    "Records",
    "ReplyParseError",
    "ResolvedLM",
    "adapter_for",
    "build_lm",
    "classify_error",
    "default_adapter",
    "extract_json",
    "find_json_object",
    "finish_reason_of",
    "parse_leniently",
    "parse_retry_after",
    "read_json_object",
    "read_records",
    "record_error",
    "record_list_field",
    "repair_surrogates",
    "reply_failure",
    "reset_format_memory",
    "resolve_role",
    "strip_reasoning",
    "track_calls",
    "track_parse_counts",
    "track_replies",
    "typed_value",
    "unwrap_typed",
]
