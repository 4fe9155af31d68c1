"""The rewriter's task: GEPA over the query planner's instruction, scored on recall@k of ``get_context``.

Examples (:func:`kitune.optimizers.stage_tasks.recall_examples`): the tuning questions with a gold
document; the ``no_candidate`` and ``out_of_budget`` failures first, then the others in a shuffle
seeded by ``optimize.seed`` and the iteration (the Pareto set is the first
``optimize.max_pareto_examples``, fewer when a set budget needs it). GEPA's trainset: the
questions whose current look-up does not rank a gold document's KI first, all when every one does.
An ``out_of_budget`` failure's example carries the route's feedback ("searched X (got …), got
nothing about Y", :func:`kitune.optimizers.routes.route_out_of_budget`).

Module: :class:`kitune.optimizers.stage_tasks.RewriterRecall` — one rewrite and one
``get_context`` on the setting's store per metric call (feedback KIs visible, credit demotion
applied), no agent run. Metric: :func:`kitune.optimizers.stage_tasks.recall_metric` with
``k = retrieval.default_size`` (what the agent is shown): ``1 / rank`` of the first KI citing a
gold document. The full agent runs only in the loop's validation of a proposal.

Setup measures (``improve_rewriter_<key>``): ``examples``, ``imperfect``, ``route_oob_questions``.
"""

from __future__ import annotations

from typing import Any

from kitune.evaluation.stage_metrics import reciprocal_rank
from kitune.optimizers import stage_tasks
from kitune.optimizers.improve_env import ImproveEnv, ImproveInput
from kitune.optimizers.program_spec import ProgramTask, TaskSetup
from kitune.optimizers.routes import describe_document, kinds_routed_to, route_out_of_budget
from kitune.programs.query_rewriter import QueryRewriter

__all__ = ["PLUGINS", "REWRITER", "rewriter_setup"]


def rewriter_setup(env: ImproveEnv, inp: ImproveInput) -> TaskSetup:
    """:class:`~kitune.optimizers.stage_tasks.RewriterRecall` on the setting's rewriter, the recall metric."""
    setting = inp.setting
    k = inp.cfg.retrieval.default_size
    kis_by_doc = inp.kis_by_doc
    gold, documents = stage_tasks.gold_document_map(inp.questions, inp.get_document)
    route = route_out_of_budget(inp.tune.traces, documents=documents, gold_docids=gold, kis_by_doc=kis_by_doc)
    routed = kinds_routed_to("rewriter")  # the feedback route table: no_candidate, out_of_budget
    first = [q.query_id for q in inp.questions if inp.kinds.get(q.query_id) in routed]
    examples = stage_tasks.recall_examples(
        inp.questions,
        first=first,
        seed=f"{inp.cfg.optimize.seed}:rewriter:{inp.iteration}",
        describe=lambda d: describe_document(d, documents, kis_by_doc),
        notes=route.rewriter,
    )

    def current(ex: Any) -> float:  # the setting's own rewriter (memoised by the environment)
        return reciprocal_rank(ex.gold_docids, env.lookup(setting, ex.question).kis, k)

    ranks = {ex.query_id: current(ex) for ex in examples}
    train = stage_tasks.imperfect(examples, lambda ex: ranks[ex.query_id])

    def lookup(rw: Any, question: str) -> Any:
        return env.lookup(setting, question, rewriter=rw)

    module = stage_tasks.RewriterRecall(QueryRewriter(setting.prompts["rewriter"]), lookup=lookup)
    metrics = {
        "examples": float(len(examples)),
        "imperfect": float(sum(r < 1.0 for r in ranks.values())),
        "route_oob_questions": float(len(route.rewriter)),
    }
    return TaskSetup(module, train, stage_tasks.recall_metric(k), valset=examples, metrics=metrics)


REWRITER = ProgramTask(
    "rewriter",
    predictor="rewriter.planner",
    lm_role="rewrite",
    setup=rewriter_setup,
    task_words=("query", "search", "look-up", "lookup", "plan"),
    order=20,
    stage_metric="mrr",
)

PLUGINS = {"rewriter": REWRITER}
"""This module's program task, registered by :data:`kitune.optimizers.program_task.PROGRAM_TASKS`."""
