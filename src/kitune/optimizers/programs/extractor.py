"""The extractor's task: GEPA over its instruction, scored on answer coverage of the tuning gold documents.

Examples (:func:`kitune.optimizers.stage_tasks.coverage_examples`): one per *coverable* gold
document of the tuning questions (its text states the answer of a non-yes/no question it is gold
for). Order, and so the Pareto set (the first ``optimize.max_pareto_examples``, fewer when a set
budget needs it): the gold documents of ``no_candidate`` failures and the never-surfaced gold
documents of ``out_of_budget`` failures (:func:`kitune.optimizers.routes.route_out_of_budget`)
first, then the others in a shuffle seeded by ``optimize.seed`` and the iteration. GEPA's
trainset (reflection minibatches): the documents whose current KIs miss an answer, all when none
does. Each example carries, as feedback, what the agent did with the document's current KIs
(:func:`kitune.optimizers.tasks.extraction_outcomes`) and the ``out_of_budget`` route's line.

Module: the setting's extractor with the on-disk extraction cache
(:class:`~kitune.optimizers.extraction_cache.CachedFactExtractor`), so the seed evaluation of the
current instruction reads what the loop already extracted and no document is extracted twice
with one instruction. Metric: :func:`kitune.optimizers.stage_tasks.coverage_metric` — one
document's covered / (covered + missed) answers, feedback the missed answer-bearing sentences.

Setup measures (``improve_extractor_<key>``): ``examples``, ``imperfect`` (documents whose current
KIs miss an answer), ``route_oob_questions``, ``route_oob_extractor_items``,
``route_oob_items_with_sentence``.
"""

from __future__ import annotations

from typing import Any

from kitune.evaluation.stage_feedback import document_coverage
from kitune.optimizers import stage_tasks, tasks
from kitune.optimizers.improve_env import ImproveEnv, ImproveInput
from kitune.optimizers.program_spec import ProgramTask, TaskSetup
from kitune.optimizers.routes import kinds_routed_to, route_out_of_budget

__all__ = ["EXTRACTOR", "PLUGINS", "extractor_setup"]


def extractor_setup(env: ImproveEnv, inp: ImproveInput) -> TaskSetup:
    """The cached extractor (the setting's instruction and limits), coverable gold documents, coverage."""
    kis_by_doc = inp.kis_by_doc
    outcomes = tasks.extraction_outcomes(inp.questions, inp.tune.traces, kis_by_doc, kinds=inp.kinds)
    gold, documents = stage_tasks.gold_document_map(inp.questions, inp.get_document)
    route = route_out_of_budget(inp.tune.traces, documents=documents, gold_docids=gold, kis_by_doc=kis_by_doc)
    for item in route.extractor:
        outcomes[item.docid] = f"{outcomes.get(item.docid, '')} {item.text()}".strip()
    whole = kinds_routed_to("extractor", from_trace=False)  # the feedback route table
    first = [
        d
        for q in inp.questions
        if inp.kinds.get(q.query_id) in whole  # no_candidate: all its gold documents
        for d in (q.gold_docids or q.evidence_docids)
    ] + [item.docid for item in route.extractor]
    examples = stage_tasks.coverage_examples(
        inp.questions,
        inp.get_document,
        first=first,
        outcomes=outcomes,
        seed=f"{inp.cfg.optimize.seed}:extractor:{inp.iteration}",
    )

    def current(ex: Any) -> float:  # the document's coverage with the KIs the loop extracted
        return document_coverage(documents[ex.docid], inp.questions, kis_by_doc.get(ex.docid, [])).score

    train = stage_tasks.imperfect(examples, current)
    metrics = {
        "examples": float(len(examples)),
        "imperfect": float(sum(current(ex) < 1.0 for ex in examples)),
        **route.to_metrics(),
    }
    return TaskSetup(
        env.extractor(inp.setting),
        train,
        stage_tasks.coverage_metric(inp.questions),
        valset=examples,
        metrics=metrics,
    )


EXTRACTOR = ProgramTask(
    "extractor",
    predictor="extract",
    lm_role="extract",
    setup=extractor_setup,
    task_words=("fact",),
    order=10,
    names_store=True,
    stage_metric="answer_coverage",
)

PLUGINS = {"extractor": EXTRACTOR}
"""This module's program task, registered by :data:`kitune.optimizers.program_task.PROGRAM_TASKS`."""
