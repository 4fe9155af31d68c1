"""The rewriter's task: GEPA over the query planner's instruction through whole agent episodes.

Examples: the tuning questions. Module: :class:`kitune.optimizers.tasks.InContextQA` (rewrite →
``get_context`` on the setting's store → the budgeted agent → graded answer). Metric:
:func:`kitune.optimizers.tasks.make_rewriter_metric` with each question's tokens in the tuning
run as its reference.
"""

from __future__ import annotations

from typing import Any

from kitune.optimizers.improve_env import ImproveEnv, ImproveInput
from kitune.optimizers.program_task import ProgramTask, TaskSetup, register_program_task

__all__ = ["REWRITER", "rewriter_setup"]


def rewriter_setup(env: ImproveEnv, inp: ImproveInput) -> TaskSetup:
    """The in-context agent around the setting's rewriter, the tuning questions, the loop-score metric."""
    from kitune.optimizers import tasks
    from kitune.optimizers.objective import LoopWeights
    from kitune.programs.query_rewriter import QueryRewriter

    setting = inp.setting

    def factory(rw: Any) -> Any:
        return env.context_fn(setting, rewriter=rw)

    module = tasks.InContextQA(
        QueryRewriter(setting.prompts["rewriter"]),
        context_factory=factory,
        chat_model=env.deps.chat_model,
        cfg=env.setting_cfg(setting),
        judge=env.deps.judge,
        corpus_store=env.deps.corpus_store,
    )
    refs = {t.query_id: float(t.input_tokens + t.tool_input_tokens) for t in inp.tune.traces}
    metric = tasks.make_rewriter_metric(LoopWeights.from_config(env.cfg), refs)
    return TaskSetup(module, tasks.qa_examples(env.tune), metric)


REWRITER = register_program_task(
    ProgramTask(
        "rewriter",
        predictor="rewriter.planner",
        lm_role="rewrite",
        setup=rewriter_setup,
        task_words=("query", "search", "look-up", "lookup", "plan"),
        order=20,
    )
)
