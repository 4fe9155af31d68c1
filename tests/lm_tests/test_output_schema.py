"""kitune's output schema equals the one DSPy's JSON adapter derives (issue 38, item 7).

``lm/adapters.py`` no longer imports DSPy's private ``_get_structured_outputs_response_format``;
it builds the schema from the public ``signature.output_fields``. The request bytes (and so the
committed recordings' hashes) depend on it, so it must stay equal for every kitune signature.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import dspy
import pytest
from dspy.adapters.json_adapter import _get_structured_outputs_response_format

import kitune.programs
from kitune.lm.adapters import output_schema


def _signatures() -> list[type[dspy.Signature]]:
    found: dict[str, type[dspy.Signature]] = {}
    for info in pkgutil.iter_modules(kitune.programs.__path__):
        module = importlib.import_module(f"kitune.programs.{info.name}")
        for name, obj in vars(module).items():
            if inspect.isclass(obj) and issubclass(obj, dspy.Signature) and obj is not dspy.Signature:
                found[f"{module.__name__}.{name}"] = obj
    return [found[k] for k in sorted(found)]


SIGNATURES = _signatures()


def test_kitune_has_signatures_to_compare() -> None:
    assert len(SIGNATURES) >= 4


@pytest.mark.parametrize("signature", SIGNATURES, ids=lambda s: s.__name__)
@pytest.mark.parametrize("native", [True, False])
def test_output_schema_matches_dspys(signature: type[dspy.Signature], native: bool) -> None:
    try:
        expected = _get_structured_outputs_response_format(signature, native).model_json_schema()
    except ValueError:
        with pytest.raises(ValueError, match="open-ended mapping"):
            output_schema(signature, skip_tool_calls=native)
        return
    assert output_schema(signature, skip_tool_calls=native) == expected


def test_an_open_mapping_has_no_closed_schema() -> None:
    class Loose(dspy.Signature):
        text: str = dspy.InputField()
        facts: dict[str, str] = dspy.OutputField()

    with pytest.raises(ValueError, match="'facts' is an open-ended mapping"):
        output_schema(Loose)
