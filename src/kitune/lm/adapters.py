"""Adapters: which ``dspy.Adapter`` turns a signature into a request for a given LM."""

from __future__ import annotations

from typing import Any

import dspy
from dspy.adapters.json_adapter import _get_structured_outputs_response_format

from kitune.lm.client import KituneLM

__all__ = ["LocalJSONAdapter", "adapter_for", "default_adapter"]


class LocalJSONAdapter(dspy.JSONAdapter):  # type: ignore[misc]
    """JSONAdapter for llama.cpp's server: the schema goes as ``{"type": "json_object", "schema": ...}``.

    That is llama.cpp's grammar-constrained JSON mode, which it accepts; OpenAI's ``json_schema``
    form it rejects with HTTP 500.
    """

    def _prepare_response_format(self, lm: Any, lm_kwargs: dict[str, Any], signature: Any) -> None:
        try:
            model = _get_structured_outputs_response_format(signature, self.use_native_function_calling)
            schema = model.model_json_schema()
        except Exception:  # open-ended mapping or unschematisable field: plain JSON mode
            lm_kwargs["response_format"] = {"type": "json_object"}
            return
        lm_kwargs["response_format"] = {"type": "json_object", "schema": schema}


def adapter_for(lm: KituneLM) -> dspy.Adapter:
    """The adapter to use with ``lm``: :class:`LocalJSONAdapter` for the local model, else JSONAdapter.

    JSONAdapter sends the signature's output types as ``response_format`` (native structured
    output where the provider supports it; the capability ladder downgrades to ``json_object`` or
    prompt-only JSON when it does not). Scope it with ``dspy.context(lm=lm, adapter=adapter_for(lm))``.
    """
    return LocalJSONAdapter() if lm.resolved.is_local else dspy.JSONAdapter()


def default_adapter(lm: Any) -> dspy.Adapter:
    """The adapter a program uses when the DSPy context sets none.

    :func:`adapter_for` for a :class:`KituneLM` (the output types become ``response_format``);
    for any other ``dspy.LM`` (test doubles, plain LiteLLM) a ChatAdapter *without* its JSON
    fallback, so a reply the adapter cannot parse costs no second call: the program's own
    parser reads the raw reply instead.
    """
    if isinstance(lm, KituneLM):
        return adapter_for(lm)
    return dspy.ChatAdapter(use_json_adapter_fallback=False)
