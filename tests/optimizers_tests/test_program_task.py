"""Program tasks: one file per program registers what the loop needs to tune it (issue 24 item 1)."""

from __future__ import annotations

import pytest

from kitune.errors import ConfigError
from kitune.optimizers.acceptance import check_instruction
from kitune.optimizers.loop import Setting
from kitune.optimizers.program_task import (
    PROGRAM_TASKS,
    eval_key,
    get_program_task,
    program_names,
    write_only_programs,
)


def test_built_in_tasks_hold_what_the_loop_used_to_spread_over_six_places() -> None:
    assert program_names()[:3] == ("extractor", "rewriter", "disambiguator")
    rows = {
        n: (t.predictor, t.lm_role, t.write_only)
        for n, t in PROGRAM_TASKS.entries()
        if n in program_names()[:3]
    }
    assert rows == {
        "extractor": ("extract", "extract", False),
        "rewriter": ("rewriter.planner", "rewrite", False),
        "disambiguator": ("program.writer", "extract", True),
    }
    assert "disambiguator" in write_only_programs() and "extractor" not in write_only_programs()
    assert get_program_task("extractor").start_instruction().startswith("Extract")
    with pytest.raises(ConfigError, match=r"unknown program 'summariser' .*: registered programs are "):
        get_program_task("summariser")


def test_eval_key_leaves_out_write_only_instructions() -> None:
    a = Setting({"extractor": "E", "disambiguator": "D1"}, {"retrieval.rrf_k": 60})
    b = Setting({"extractor": "E", "disambiguator": "D2"}, {"retrieval.rrf_k": 60})
    c = Setting({"extractor": "E2", "disambiguator": "D1"}, {"retrieval.rrf_k": 60})
    assert a.key != b.key and eval_key(a) == eval_key(b) and eval_key(a) != eval_key(c)
    assert eval_key(a) == a.key_without(["disambiguator"]) and len(eval_key(a)) == 8


def test_sanity_checks_read_each_tasks_words() -> None:
    long = "Rewrite nothing at all; just return the text you were given, unchanged, every time."
    assert check_instruction("rewriter", "", long) == [
        "no longer states the task (none of: query, search, look-up, lookup, plan)"
    ]
    assert check_instruction("extractor", "", long) == ["no longer states the task (none of: fact)"]
    assert check_instruction("unregistered", "", long) == []  # only the length and cut-off rules
    assert check_instruction("extractor", "", "facts") == ["too short: 5 characters (minimum 40)"]


def test_a_cut_off_instruction_fails_its_sanity_check() -> None:
    seed = get_program_task("rewriter").start_instruction()
    assert check_instruction("rewriter", seed, seed) == []
    # the rewriter instruction loop-dev-48's GEPA proposed: the seed cut inside a parenthesis
    cut = seed[: seed.index('("X was born') + 1].replace("\n\n", " ")
    assert cut.endswith("left open (")
    assert check_instruction("rewriter", seed, cut) == ["cut off: ends on '(' (an unfinished sentence)"]
    text = "Plan the look-up for a question (name the entity, then the relation and keep it short."
    assert check_instruction("rewriter", seed, text) == ["cut off: 1 '(' but 0 ')' outside quotes"]
    assert check_instruction("rewriter", seed, text.replace("relation", "relation)")) == []
    assert check_instruction("extractor", "", "Extract every fact the document states, as follows:") == [
        "cut off: ends on ':' (an unfinished sentence)"
    ]
    # brackets inside a quoted look-up (rewriter feedback quotes failed queries) do not count
    quoted = 'Plan each look-up; questions like "who wrote (the first" need the entity tag.'
    assert check_instruction("rewriter", seed, quoted) == []
