"""The loop learns: the real loop (run_loop + ServiceLoopEnv) with a reader whose answer depends on
the KIs it actually retrieves.

The reader (``loop_fakes.agent_turn``) calls ``get_context`` with the question, then answers the
gold answer only if it appears in what it was shown, else "Lyon". The scripted extractor keeps
only each document's first sentence, so q2 (Eiffel Tower, 1889) and q3 (Lima, 1535) are wrong
until a disambiguation KI written from the failure states the answer.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parents[1] / "service_tests"))
sys.path.insert(0, str(Path(__file__).parent))

from loop_fakes import QUESTIONS, make_deps, task_rule, write_dataset
from opt_fakes import RuleLM

from kitune.config import KituneConfig
from kitune.data.loaders import load_corpus, load_questions
from kitune.evaluation.report import summarize
from kitune.optimizers.loop import Proposal, Setting, initial_prompts, run_loop
from kitune.optimizers.objective import RunStats, loop_score
from kitune.schema import Filter
from kitune.service.pipelines.eval_cache import store_fingerprint
from kitune.service.tuning.loop_env import ServiceLoopEnv
from kitune.service.tuning.options import OptimizeOptions
from kitune.testing.chat import ScriptedChatModel
from kitune.testing.store_contract import make_ki
from kitune.testing.tracking import RecordingTracker


def _env(
    tmp_path: Path, *, chat: Any = None, env_cls: type[ServiceLoopEnv] = ServiceLoopEnv
) -> ServiceLoopEnv:
    data = write_dataset(tmp_path / "data")
    cfg = KituneConfig(
        workdir=tmp_path / "w",
        corpus_name="tiny",
        agent={"max_steps": 4, "concurrency": 1},
        optimize={"validation_fraction": 0.5, "seed": 0},
        extraction={"concurrency": 1},
    )
    task_lm = RuleLM(task_rule)
    deps = make_deps(task_lm, RuleLM(lambda s, u: {"new_instruction": "unused"}, json=True))
    if chat is not None:
        deps.chat_model = chat
    opts = OptimizeOptions(data_dir=data, programs=(), distractors=0, progress=False)
    env = env_cls(
        cfg,
        opts,
        deps,
        questions=load_questions(data),
        documents=load_corpus(data),
        state_dir=tmp_path / "w" / "optimize" / "t",
    )
    by_id = {q.query_id: q for q in env.questions}
    # a fixed split, so the assertions name questions: q2 (1889) fails on tune, q3 (1535) on validation
    env.tune, env.validation = [by_id["q2"], by_id["q4"]], [by_id["q1"], by_id["q3"]]
    return env


def _start(env: ServiceLoopEnv) -> Setting:
    return Setting(initial_prompts(("extractor", "disambiguator"), corpus="tiny", registry=None))


def _agent_calls(env: ServiceLoopEnv) -> int:
    model = env.deps.chat_model
    assert isinstance(model, ScriptedChatModel)
    return 2000 - model.remaining


def _disambiguator_calls(lm: RuleLM, question: str) -> int:
    return sum(question in str(h["messages"]) for h in lm.history if "correct_answer" in str(h["messages"]))


def test_feedback_ki_flips_its_question_next_iteration_and_is_not_resent(tmp_path: Path) -> None:
    env = _env(tmp_path)
    try:
        # the feedback mechanics, on the old rule: with 2 validation questions the stage rule cannot
        # show a batch non-inferior and retires it (tests/optimizers_tests/test_batch_decision.py)
        result = run_loop(
            env,
            _start(env),
            iterations=2,
            state_dir=env.state_dir,
            tracker=RecordingTracker(),
            decision_rule="permissive",
        )
    finally:
        env.close()
    r0, r1 = result.history
    # (a) iteration 0: q2 wrong (a wrong number), a feedback KI is written; iteration 1 measures it
    assert r0.tune_accuracy == 0.5 and r0.failure_kinds["tune"]["wrong_number"] == 1
    assert r1.tune_accuracy == 1.0
    assert r1.flips["tune"] == {"fixed": ["q2"], "broken": []}
    assert r1.tune_score > 0.4
    ledger = (env.state_dir / "failure_ledger.json").read_text()
    import json

    q2 = json.loads(ledger)["questions"]["q2"]
    assert q2["outcomes"]["0"]["kind"] == "wrong_number" and q2["outcomes"]["1"]["correct"] is True
    (fb,) = q2["feedback"]
    assert fb["iteration"] == 0 and fb["prediction"] == "Lyon" and len(fb["ki_ids"]) == 1
    assert fb["retrieved_next"] is True and fb["fixed_next"] is True
    # (b) the fixed question is not sent to the disambiguator again: one call for q2 in 2 iterations
    lm = env.deps.lms["extract"]
    assert _disambiguator_calls(lm, QUESTIONS[1][1]) == 1
    # validation questions are never sent to the disambiguator (q3 stays wrong: held out)
    assert _disambiguator_calls(lm, QUESTIONS[2][1]) == 0
    assert r1.val_accuracy == 0.5
    assert (env.state_dir / "failure_ledger.md").read_text().count("| q2 | tune | wrong_number | ✓ |") == 1


def test_store_state_keys_the_evaluation_cache(tmp_path: Path) -> None:
    env = _env(tmp_path)
    setting = _start(env)
    try:
        first = env.evaluate(setting, "tune")
        calls = _agent_calls(env)
        assert first.metrics["eval_run"] == 2.0 and calls > 0
        # (c) unchanged store: the same evaluation is read back, no agent call
        again = env.evaluate(setting, "tune")
        assert _agent_calls(env) == calls and again.store_state == first.store_state
        assert [t.exact_answer for t in again.traces] == [t.exact_answer for t in first.traces]
        # a store change that no look-up can see (an expired KI is never served): the cache key
        # changes, every question's look-ups are replayed, all are identical, all reused
        store = env.store_for(setting)
        hidden = make_ki("Atlantis", "nowhere", docid="d9", status="expired")
        store.upsert([hidden])
        assert store_fingerprint(store) != first.store_state
        unseen = env.evaluate(setting, "tune")
        assert unseen.metrics["eval_reused"] == 2.0 and unseen.metrics["eval_run"] == 0.0
        assert _agent_calls(env) == calls
        # a KI that a look-up does return: that question runs again
        store.upsert(
            [
                make_ki(
                    "Eiffel Tower",
                    "1889",
                    docid="d2",
                    predicate="opened_in",
                    title="In which year did the Eiffel Tower open? It opened in 1889.",
                )
            ]
        )
        changed = env.evaluate(setting, "tune")
        assert changed.metrics["eval_run"] >= 1.0 and _agent_calls(env) > calls
        by_id = {t.query_id: t for t in changed.traces}
        assert by_id["q2"].exact_answer == "1889"
        assert store.count(Filter(statuses=("expired",))) == 1
    finally:
        env.close()


def test_score_ranks_accuracy_over_tokens_at_both_scales() -> None:
    # (d) 88/96 at 42.6M ranks above 60/96 at 38M, and the same at 1/1000 of the tokens
    for scale in (1.0, 1e-3):
        ref = RunStats(60 / 96, 174.8e6 * scale / 96, 28 / 96, 96)
        good = RunStats(88 / 96, 42.6e6 * scale / 96, 27 / 96, 96)
        cheap = RunStats(60 / 96, 38.0e6 * scale / 96, 27 / 96, 96)
        assert loop_score(good, ref) > loop_score(cheap, ref)
        assert loop_score(good, cheap) > 0 > loop_score(cheap, good)


class _FailingChat(ScriptedChatModel):
    """The scripted reader, except that questions about ``fail_on`` raise a provider error."""

    def __init__(self, fail_on: tuple[str, ...]) -> None:
        from loop_fakes import agent_turn

        super().__init__([agent_turn] * 2000, usage=(200, 20))
        self.fail_on = fail_on

    def complete(self, messages: Any, *args: Any, **kwargs: Any) -> Any:
        if any(f in str(messages[1]["content"]) for f in self.fail_on):
            raise ConnectionError("gateway unreachable (503 after 3 retries)")
        return super().complete(messages, *args, **kwargs)


def test_failed_questions_are_not_wrong_and_block_the_decision(tmp_path: Path) -> None:
    # (e) the LM fails on q2 and q3: recorded as failed (not graded, not a wrong answer)
    env = _env(tmp_path, chat=_FailingChat(("Eiffel", "Lima")))
    try:
        result = run_loop(env, _start(env), iterations=1, state_dir=env.state_dir, tracker=RecordingTracker())
        tune = env.evaluate(_start(env), "tune")
    finally:
        env.close()
    (r0,) = result.history
    failed = {t.query_id: t for t in tune.traces if t.status == "failed"}
    assert set(failed) == {"q2"} and failed["q2"].judge_status != "graded"
    s = summarize(list(tune.traces))
    assert s.n_failed == 1 and s.n_graded == 1 and s.accuracy == 1.0  # q4 right, q2 excluded
    assert r0.failed == {"tune": 1, "validation": 1}
    assert r0.failure_kinds["tune"]["failed"] == 1 and r0.failure_kinds["tune"]["wrong_number"] == 0
    assert r0.decision == "undecided" and "failed" in r0.reason and not r0.accepted
    # nothing was written from a failed question
    assert not list(env.store_for(_start(env)).iter_kis(Filter(statuses=(), subtypes=("disambiguation",))))


class _DegenerateEnv(ServiceLoopEnv):
    """Proposes the two-character disambiguator instruction GEPA once produced."""

    evaluated: list[str]

    def evaluate(self, setting: Setting, split: str) -> Any:
        self.evaluated = [*getattr(self, "evaluated", []), setting.key]
        return super().evaluate(setting, split)

    def improve(self, setting: Setting, tune: Any, iteration: int, *, ledger: Any = None) -> Proposal:
        return Proposal(Setting({**setting.prompts, "disambiguator": "ok"}, setting.knobs))


def test_degenerate_proposal_is_rejected_before_evaluation(tmp_path: Path) -> None:
    # (f)
    env = _env(tmp_path, env_cls=_DegenerateEnv)
    start = _start(env)
    try:
        result = run_loop(env, start, iterations=1, state_dir=env.state_dir, tracker=RecordingTracker())
    finally:
        env.close()
    (r0,) = result.history
    assert r0.decision == "rejected" and "too short: 2 characters" in r0.reason
    assert r0.candidate_key not in env.evaluated  # never evaluated
    assert result.setting == start


def test_after_a_promotion_context_and_extract_use_the_promoted_versions(tmp_path: Path) -> None:
    # (g) what the loop decides is what runs: production_setting (used by serve, context,
    # extract, eval and the MCP server) follows the registry's production alias and its KI table
    from kitune.programs.instructions import instruction_version
    from kitune.service.serving.prompts import production_setting
    from kitune.tracking.prompts import PromptRegistry, prompt_name, register_packaged

    cfg = KituneConfig(workdir=tmp_path / "w", corpus_name="tiny")
    registry = PromptRegistry(cfg.mlflow_uri)
    assert set(register_packaged(registry, "tiny", ["extractor", "rewriter"])) == {"extractor", "rewriter"}
    before = production_setting(cfg, registry)
    packaged = before.prompts["extractor"]
    name = prompt_name("tiny", "extractor")
    promoted = "Extract every fact of the document with its DATES, one sentence per fact."
    pv = registry.register(name, promoted)
    assert pv.version == 2  # the packaged prompt is version 1
    registry.promote(name, pv.version)
    after = production_setting(cfg, registry)
    assert after.prompts["extractor"] == promoted != packaged
    suffix = instruction_version("extractor", promoted).split("@")[1]
    assert after.store_cfg.store.table.endswith(suffix)  # extract writes, context reads this table
    assert before.store_cfg.store.table != after.store_cfg.store.table
    # rollback goes back to the packaged version 1, and what runs follows
    registry.rollback(name)
    assert production_setting(cfg, registry).prompts["extractor"] == packaged
