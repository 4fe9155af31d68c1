"""Packaged prompt texts and their content-hash versions."""

from __future__ import annotations

import hashlib

import pytest

from kitune.errors import ConfigError
from kitune.programs.instructions import available_instructions, instruction_version, load_instruction


def test_version_is_name_plus_sha8_of_stripped_text() -> None:
    digest = hashlib.sha256(b"Do the task.").hexdigest()[:8]
    assert instruction_version("extractor", "  Do the task.\n") == f"extractor@{digest}"


def test_load_extractor_is_stable_and_stripped() -> None:
    a, b = load_instruction("extractor"), load_instruction("extractor")
    assert a == b
    assert a.name == "extractor" and a.text == a.text.strip() and a.text
    assert a.version == instruction_version("extractor", a.text)
    assert "extractor" in available_instructions()


def test_unknown_prompt_names_the_available_ones() -> None:
    with pytest.raises(ConfigError, match=r"no packaged prompt 'nope'.*extractor"):
        load_instruction("nope")


@pytest.mark.parametrize("name", ["../secrets", "Extractor", "extractor.txt", ""])
def test_names_that_are_paths_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="instruction name"):
        load_instruction(name)
