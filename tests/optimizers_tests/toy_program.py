"""A toy program task added by this one file: importing it registers ``toy`` in the program registry.

The toy program answers ``toy_text -> toy_summary`` with one predictor (``summarise``); its
stage metric scores 1.0 when the summary is ``dated`` (the scripted task LM writes that only when
the instruction asks for DATES), else 0.0. It is write-only, so the loop judges a proposal by this
metric, and it has no packaged prompt: it starts from :data:`START`.
"""

from __future__ import annotations

from typing import Any

import dspy

from kitune.optimizers.improve_env import ImproveEnv, ImproveInput
from kitune.optimizers.program_spec import ProgramTask, TaskSetup
from kitune.optimizers.program_task import register_program_task

START = "Summarise the facts of the toy text in a few words."


class ToySummary(dspy.Module):  # type: ignore[misc]
    def __init__(self, instruction: str) -> None:
        super().__init__()
        self.summarise = dspy.Predict(dspy.Signature("toy_text -> toy_summary", instruction))

    def forward(self, toy_text: str) -> Any:
        return self.summarise(toy_text=toy_text)


def toy_metric(gold: Any, pred: Any, trace: Any = None, pred_name: Any = None, pred_trace: Any = None) -> Any:
    dated = getattr(pred, "toy_summary", "") == "dated"
    return dspy.Prediction(
        score=float(dated), feedback="dated" if dated else "Say which DATES the text gives."
    )


def toy_setup(env: ImproveEnv, inp: ImproveInput) -> TaskSetup:
    examples = [dspy.Example(toy_text=q.query).with_inputs("toy_text") for q in inp.questions]
    return TaskSetup(ToySummary(inp.setting.prompts["toy"]), examples, toy_metric)


def toy_rule(system: str, user: str) -> dict[str, Any] | None:
    """The scripted task LM's reply to a toy request (None: not a toy request)."""
    if "[[ ## toy_text ## ]]" not in user:
        return None
    return {"toy_summary": "dated" if "DATES" in system else "plain"}


TOY = register_program_task(
    ProgramTask(
        "toy",
        predictor="summarise",
        lm_role="extract",
        setup=toy_setup,
        write_only=True,
        task_words=("fact",),
        instruction=START,
    )
)
