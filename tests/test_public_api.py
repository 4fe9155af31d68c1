"""Every package's __all__ names exist, and nothing private is exported (httpx-style guard)."""

import importlib

import pytest

PACKAGES = [
    "kitune",
    "kitune.programs",
    "kitune.retrieval",
    "kitune.evaluation",
    "kitune.data",
    "kitune.errors",
    "kitune.config",
    "kitune.ki",
    "kitune.schema",
    "kitune.text",
    "kitune.usage",
    "kitune.chat",
    "kitune.lm",
    "kitune.localmodel",
    "kitune.optimizers",
    "kitune.service",
    "kitune.tracking",
    "kitune.testing",
]


@pytest.mark.parametrize("name", PACKAGES)
def test_all_names_exist_and_are_public(name):
    module = importlib.import_module(name)
    exported = getattr(module, "__all__", None)
    assert exported, f"{name} has no __all__"
    for attr in exported:
        assert hasattr(module, attr), f"{name}.__all__ lists missing {attr}"
        assert not attr.startswith("_") or attr == "__version__"
    assert len(exported) == len(set(exported))


def test_the_optimizers_export_the_loop_protocols_and_artifact_helpers():
    import kitune.optimizers as optimizers
    from kitune.optimizers.artifacts import log_candidate, log_program_state
    from kitune.optimizers.protocols import PromptRegistryProtocol, Tracker

    expected = {
        "Tracker": Tracker,
        "PromptRegistryProtocol": PromptRegistryProtocol,
        "log_candidate": log_candidate,
        "log_program_state": log_program_state,
    }
    assert set(expected) <= set(optimizers.__all__)
    assert {name: getattr(optimizers, name) for name in expected} == expected


def test_top_level_is_light():
    import subprocess
    import sys

    code = "import sys, kitune; print(int('dspy' in sys.modules), int('lancedb' in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == ["0", "0"]
