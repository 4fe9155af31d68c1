"""The optimiser registry: built-ins found by name, one budget object, clear errors for unknown names."""

from __future__ import annotations

import random
from typing import Any

import pytest
from opt_fakes import reflection_lm

from kitune.errors import ConfigError
from kitune.optimizers.budget import OptimizerBudget
from kitune.optimizers.gepa import GepaOptimizer
from kitune.optimizers.mipro import DEFAULT_TRIALS, MiproOptimizer
from kitune.optimizers.registry import (
    OPTIMIZERS,
    Registry,
    check_optimizer,
    make_optimizer,
    optimizer_names,
    register_optimizer,
    unregister_optimizer,
)
from kitune.optimizers.stopping import TimeoutStopCondition
from kitune.optimizers.tasks import extractor_metric


def test_built_in_optimizers_are_listed_without_importing_them_first() -> None:
    assert {"gepa", "mipro"} <= set(optimizer_names())
    assert check_optimizer("gepa") == "gepa"
    with pytest.raises(ConfigError) as err:
        check_optimizer("adam")
    msg = str(err.value)
    assert msg.startswith(
        "unknown optimizer 'adam' (optimize.optimizer / --optimizer): registered optimizers are "
    )
    assert "gepa, mipro" in msg


def test_factories_read_one_budget() -> None:
    budget = OptimizerBudget(
        max_metric_calls=7, minutes=2, threads=3, reflection_context_tokens=4096, reflection_max_tokens=800
    )
    refl = reflection_lm()
    g = make_optimizer("gepa", extractor_metric, reflection_lm=refl, budget=budget, rng=random.Random(0))
    assert isinstance(g, GepaOptimizer)
    assert (g.max_metric_calls, g.num_threads, g.reflection_context_tokens, g.reflection_max_tokens) == (
        7,
        3,
        4096,
        800,
    )
    assert len(g.stoppers) == 1 and isinstance(g.stoppers[0], TimeoutStopCondition)
    assert g.stoppers[0].timeout_seconds == 120
    m = make_optimizer("mipro", extractor_metric, reflection_lm=refl, budget=budget, rng=random.Random(0))
    assert isinstance(m, MiproOptimizer) and (m.num_trials, m.num_threads) == (7, 3)
    unset = make_optimizer(
        "mipro", extractor_metric, reflection_lm=refl, budget=OptimizerBudget(), rng=random.Random(0)
    )
    assert isinstance(unset, MiproOptimizer) and unset.num_trials == DEFAULT_TRIALS
    with pytest.raises(ConfigError, match="registered optimizers are"):
        make_optimizer("adam", extractor_metric, reflection_lm=refl, budget=budget, rng=random.Random(0))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("threads", 0),
        ("max_metric_calls", 0),
        ("minutes", 0.0),
        ("min_proposals", 0),
        ("reflection_max_tokens", 0),
    ],
)
def test_budget_refuses_out_of_range_values(field: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=f"optimizer budget {field}="):
        OptimizerBudget(**{field: value})


def test_registry_names_are_checked_and_taken_names_refused() -> None:
    reg: Registry[str] = Registry("widget", setting="--widget")
    assert reg.register("a-1", "x") == "x"
    reg.register("a-1", "x")  # the same entry again: a module imported twice
    with pytest.raises(ValueError, match="already registered"):
        reg.register("a-1", "y")
    reg.register("a-1", "y", replace=True)
    assert reg.get("a-1") == "y"
    for bad in ("", "Upper", "has space"):
        with pytest.raises(ValueError, match="use lower-case"):
            reg.register(bad, "z")
    with pytest.raises(ConfigError, match=r"unknown widget\(s\) \['b'\] \(--widget\): choose from a-1"):
        reg.check(["a-1", "b"])
    assert reg.check(["a-1"]) == ("a-1",)


def test_register_optimizer_as_decorator_and_unregister() -> None:
    @register_optimizer("tmp-opt")
    def make(
        metric: Any,
        *,
        reflection_lm: Any,
        budget: OptimizerBudget,
        rng: random.Random,
        input_tokens: Any = None,
    ) -> Any:
        return ("built", budget.max_metric_calls)

    try:
        assert "tmp-opt" in optimizer_names()
        built = make_optimizer(
            "tmp-opt",
            extractor_metric,
            reflection_lm=object(),
            budget=OptimizerBudget(max_metric_calls=3),
            rng=random.Random(0),
        )
        assert built == ("built", 3)
    finally:
        unregister_optimizer("tmp-opt")
    assert "tmp-opt" not in OPTIMIZERS
