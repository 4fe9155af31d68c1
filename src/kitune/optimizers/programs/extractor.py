"""The extractor's task: GEPA over its instruction on the tuning questions' gold documents.

Examples: one per gold document (evidence documents when none) of the tuning questions, the gold
documents of no-candidate failures first, each carrying what the agent did with that document's
KIs (:func:`kitune.optimizers.tasks.extraction_outcomes`) as feedback. Metric:
:func:`kitune.optimizers.tasks.extractor_metric` (covers an answer + grounding), no LLM.
"""

from __future__ import annotations

from kitune.optimizers.improve_env import ImproveEnv, ImproveInput
from kitune.optimizers.program_task import ProgramTask, TaskSetup, register_program_task

__all__ = ["EXTRACTOR", "extractor_setup"]


def extractor_setup(env: ImproveEnv, inp: ImproveInput) -> TaskSetup:
    """The extractor's module (the setting's instruction and limits), examples and metric."""
    from kitune.optimizers import tasks

    outcomes = tasks.extraction_outcomes(
        env.tune, inp.tune.traces, env.kis_by_doc(inp.setting), kinds=inp.kinds
    )
    first = [
        d
        for q in env.tune
        if inp.kinds.get(q.query_id) == "no_candidate"
        for d in (q.gold_docids or q.evidence_docids)
    ]
    examples = tasks.extractor_examples(env.tune, env.get_document, outcomes=outcomes, first=first)
    return TaskSetup(env.extractor(inp.setting), examples, tasks.extractor_metric)


EXTRACTOR = register_program_task(
    ProgramTask(
        "extractor",
        predictor="extract",
        lm_role="extract",
        setup=extractor_setup,
        task_words=("fact",),
        order=10,
    )
)
