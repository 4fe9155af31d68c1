"""One call of a program's predictor, its typed outputs read leniently: :func:`predict_typed`.

Every program (extractor, rewriter, disambiguator, judge, domain describer) calls its predictor
through here, so the adapter choice, the parse failure and the model's own text are handled in
one place:

* the adapter is the DSPy context's when one is set, else the program's default
  (:func:`kitune.lm.default_adapter`: kitune's lenient JSON adapter for a
  :class:`kitune.lm.KituneLM`, its lenient chat adapter for any other LM);
* kitune's adapters read the typed output fields leniently (:func:`kitune.lm.parse_leniently`);
  when a caller's own adapter (a plain ``dspy.JSONAdapter``) cannot parse the reply, the same
  lenient reading is applied to the model's text, so a program sees either typed fields or a
  :class:`kitune.lm.ReplyParseError` that says why there are none;
* how the call ended (``finish_reason``) and the model's own text are read from the LM layer
  (:func:`kitune.lm.track_calls`, :func:`kitune.lm.track_replies`), never from an error message.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import dspy
from dspy.utils.exceptions import AdapterParseError

from kitune.lm import (
    CallOutcome,
    KituneChatAdapter,
    ReplyParseError,
    default_adapter,
    track_calls,
    track_replies,
)

__all__ = ["TypedReply", "predict_typed"]


@dataclass(frozen=True)
class TypedReply:
    """What one predictor call returned."""

    prediction: dspy.Prediction | None
    """The typed output fields; None when the reply could not be read (see :attr:`error`)."""
    error: ReplyParseError | None
    """Why the reply could not be read (``reason``: ``no_json``, ``cut_off``, ``malformed_json``,
    ``invalid_fields``); None when it was."""
    raw: str
    """The model's own text of the last reply ("" when no reply was seen)."""
    finish_reason: str | None
    """How the last :class:`kitune.lm.KituneLM` call ended (``"stop"``, ``"length"`` …); None when
    the LM is another class (not tracked) or gave none."""
    calls: tuple[CallOutcome, ...] = ()
    """Every :class:`kitune.lm.KituneLM` call made (cache hits included), in order."""


def predict_typed(
    predictor: dspy.Predict,
    *,
    adapter: Callable[[Any], dspy.Adapter] = default_adapter,
    config: Mapping[str, Any] | None = None,
    **inputs: Any,
) -> TypedReply:
    """Call ``predictor`` once and read its typed outputs.

    Args:
        predictor: the program's named predictor.
        adapter: LM → the adapter to use when the DSPy context sets none (the context's wins).
        config: per-call LM settings (``max_tokens``, ``cache``, ``rollout_id``, ``temperature`` …).
        **inputs: the signature's input fields.

    Returns:
        :class:`TypedReply`: typed fields, or the :class:`kitune.lm.ReplyParseError` and the raw text.

    Raises:
        Whatever the LM raises (``kitune.errors.LMError`` and DSPy's own errors): transport
        failures are the caller's to judge; only an unreadable reply is data here.
    """
    lm = predictor.lm or dspy.settings.lm
    overrides: dict[str, Any] = {}
    if dspy.settings.adapter is None:
        overrides["adapter"] = adapter(lm)
    prediction: dspy.Prediction | None = None
    failure: AdapterParseError | None = None
    with dspy.context(**overrides), track_calls() as calls, track_replies() as replies:
        try:
            prediction = predictor(**inputs, config=dict(config or {}))
        except AdapterParseError as e:
            failure = e
    if replies:
        raw = replies[-1]
    elif calls:
        raw = calls[-1].content
    else:
        raw = str(failure.lm_response or "") if failure is not None else ""
    error: ReplyParseError | None = None
    if isinstance(failure, ReplyParseError):
        error = failure
    elif failure is not None:  # a caller's own adapter failed: read the model's text leniently
        try:
            prediction = dspy.Prediction(**KituneChatAdapter().parse(predictor.signature, raw))
        except ReplyParseError as e:
            error = e
    finish = calls[-1].finish_reason if calls else None
    return TypedReply(prediction, error, raw, finish, tuple(calls))
