"""The evaluation cache is keyed by the agent settings too: changing them never reuses stale answers."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "optimizers_tests"))

from loop_fakes import make_deps
from opt_fakes import RuleLM
from test_loop_wiring import DISAMBIGUATOR, DOCS, QA, QB, first_ki_reader, first_sentence_rule

from kitune.config import KituneConfig
from kitune.optimizers.loop import Setting
from kitune.service.pipelines.eval_cache import eval_config_key
from kitune.service.tuning.loop_env import ServiceLoopEnv
from kitune.service.tuning.options import OptimizeOptions
from kitune.testing.chat import ScriptedChatModel


@pytest.mark.parametrize(
    "override",
    [
        {"agent": {"max_steps": 7}},
        {"agent": {"max_tokens": 5000}},
        {"agent": {"call_rules": "legacy"}},
        {"agent": {"ki_render": "full"}},
        {"agent": {"dedupe_kis": False}},
        {"agent": {"observation_max_chars": 900}},
        {"retrieval": {"default_size": 3}},
        {"grading": {"grader": "match"}},
        {"lm": {"agent": {"model": "openai/another-model"}}},
    ],
)
def test_eval_config_key_changes_with_every_setting_an_answer_depends_on(override: dict[str, Any]) -> None:
    assert eval_config_key(KituneConfig()) == eval_config_key(KituneConfig())
    assert eval_config_key(KituneConfig(**override)) != eval_config_key(KituneConfig())


def test_eval_config_key_ignores_what_only_changes_speed() -> None:
    assert eval_config_key(KituneConfig(agent={"concurrency": 7})) == eval_config_key(KituneConfig())
    assert eval_config_key(KituneConfig(lm={"agent": {"timeout_s": 999}})) == eval_config_key(KituneConfig())


def _env(tmp_path: Path, stores: dict[str, Any], **agent: Any) -> ServiceLoopEnv:
    cfg = KituneConfig(
        workdir=tmp_path / "w",
        corpus_name="tiny",
        agent={"max_steps": 4, "concurrency": 1, "ki_render": "full", **agent},
        extraction={"concurrency": 1},
    )
    deps = make_deps(RuleLM(first_sentence_rule), RuleLM(lambda s, u: {}, json=True), stores=stores)
    deps.chat_model = ScriptedChatModel([first_ki_reader] * 100, usage=(100, 10))
    opts = OptimizeOptions(data_dir=tmp_path, programs=("disambiguator",), progress=False)
    docs = [d for d in DOCS if any(d.docid in q.evidence_docids for q in (QA, QB))]
    env = ServiceLoopEnv(cfg, opts, deps, questions=[QA, QB], documents=docs, state_dir=tmp_path / "s")
    env.tune, env.validation = [QA], [QB]
    return env


def test_a_resumed_evaluation_under_other_agent_settings_runs_the_agent_again(tmp_path: Path) -> None:
    stores: dict[str, Any] = {}
    setting = Setting({"disambiguator": DISAMBIGUATOR})
    first = _env(tmp_path, stores).evaluate(setting, "validation")
    assert first.metrics["eval_run"] == 1.0 and [t.query_id for t in first.traces] == ["qb"]
    same = _env(tmp_path, stores)
    resumed = same.evaluate(setting, "validation")
    assert resumed.metrics["eval_run"] == 0.0 and same.deps.chat_model.calls == []  # type: ignore[attr-defined]
    for agent in (
        {"max_steps": 6},
        {"max_tokens": 20_000},
        {"call_rules": "legacy"},
        {"ki_render": "compact"},
    ):
        changed = _env(tmp_path, stores, **agent)
        again = changed.evaluate(setting, "validation")
        assert again.metrics["eval_run"] == 1.0, agent
        assert changed.deps.chat_model.calls != [], agent  # type: ignore[attr-defined]
        assert changed.eval_key(setting) != same.eval_key(setting)
