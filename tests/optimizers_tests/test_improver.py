"""The improve step as a fold over registered improvers (issue 24 item 1)."""

from __future__ import annotations

import pytest

from kitune.errors import ConfigError
from kitune.optimizers.improve_env import Improvement
from kitune.optimizers.improver import fold, get_improver, improver_names, run_improvers
from kitune.optimizers.setting import Setting


def test_built_in_improvers_are_registered_by_their_files() -> None:
    assert {"prompts", "knobs", "disambiguation"} <= set(improver_names())
    assert get_improver("knobs").name == "knobs"


def test_fold_merges_in_order_later_improvers_win() -> None:
    start = Setting({"extractor": "E0", "rewriter": "R0"}, {"retrieval.rrf_k": 60})
    a = Improvement(
        prompts={"extractor": "E1"}, metrics={"x": 1.0, "y": 1.0}, notes={"n": "a"}, programs={"p": 1}
    )
    b = Improvement(
        knobs={"retrieval.rrf_k": 7, "retrieval.tag_weight": 0.5}, metrics={"y": 2.0}, notes={"n": "b"}
    )
    proposal = fold(start, [a, b])
    assert proposal.setting == Setting(
        {"extractor": "E1", "rewriter": "R0"}, {"retrieval.rrf_k": 7, "retrieval.tag_weight": 0.5}
    )
    assert (
        proposal.metrics == {"x": 1.0, "y": 2.0}
        and proposal.notes == {"n": "b"}
        and proposal.programs == {"p": 1}
    )
    assert fold(start, []).setting == start  # nothing proposed: the current setting


def test_an_unknown_improver_is_refused_before_any_runs() -> None:
    with pytest.raises(
        ConfigError, match=r"unknown improver\(s\) \['nope'\] \(optimize.improvers\): choose from "
    ):
        run_improvers(None, None, ["knobs", "nope"])  # type: ignore[arg-type]
