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
  (:func:`kitune.lm.track_calls`, :func:`kitune.lm.track_replies`), never from an error message;
* every string a program sees is encodable as UTF-8: a lone UTF-16 surrogate (a JSON escape of
  half an emoji pair) is read as U+FFFD (:func:`kitune.lm.repair_surrogates`) and counted in
  :attr:`TypedReply.counters` (``surrogates_replaced``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import dspy
from dspy.utils.exceptions import AdapterParseError

from kitune.lm import (
    CallOutcome,
    KituneChatAdapter,
    ReplyParseError,
    default_adapter,
    repair_surrogates,
    track_calls,
    track_parse_counts,
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
    """The model's own text of the last reply ("" when no reply was seen); a lone UTF-16 surrogate
    in it (a provider that sent half an emoji pair) is kept as U+FFFD, so it can be written."""
    finish_reason: str | None
    """How the last :class:`kitune.lm.KituneLM` call ended (``"stop"``, ``"length"`` …); None when
    the LM is another class (not tracked) or gave none."""
    calls: tuple[CallOutcome, ...] = ()
    """Every :class:`kitune.lm.KituneLM` call made (cache hits included), in order."""
    counters: Mapping[str, int] = field(default_factory=dict)
    """What reading the replies repaired, summed over every reply read (:func:`kitune.lm.track_parse_counts`):
    ``surrogates_replaced`` (lone UTF-16 surrogates read as U+FFFD), ``think_stripped``,
    ``fence_stripped`` … (empty when the reply was read as written)."""


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
    with (
        dspy.context(**overrides),
        track_calls() as calls,
        track_replies() as replies,
        track_parse_counts() as parses,
    ):
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
        with track_parse_counts() as again:
            try:
                prediction = dspy.Prediction(**KituneChatAdapter().parse(predictor.signature, raw))
            except ReplyParseError as e:
                error = e
        parses.extend(again)
    finish = calls[-1].finish_reason if calls else None
    counters: Counter[str] = Counter()
    for read in parses:
        counters.update(read)
    if prediction is not None:  # a caller's own adapter's values are repaired here (kitune's are already)
        for name, value in list(prediction.items()):
            fixed = repair_surrogates(value, counters)
            if fixed is not value:
                prediction[name] = fixed
    return TypedReply(prediction, error, repair_surrogates(raw), finish, tuple(calls), dict(counters))
