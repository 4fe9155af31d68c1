"""Eval harness: budgeted agent, tools by skill, per-question traces, concurrent runs, reports."""

from __future__ import annotations

from kitune.evaluation.agent import Agent, Episode, Step
from kitune.evaluation.budget import Budget, BudgetMeter
from kitune.evaluation.harness import evaluate, read_traces
from kitune.evaluation.metrics import Trace, build_trace
from kitune.evaluation.report import RunSummary, summarize, write_report
from kitune.evaluation.tools import SKILLS, ContextObservation, Observation, Toolbox, build_toolbox

__all__ = [
    "SKILLS",
    "Agent",
    "Budget",
    "BudgetMeter",
    "ContextObservation",
    "Episode",
    "Observation",
    "RunSummary",
    "Step",
    "Toolbox",
    "Trace",
    "build_toolbox",
    "build_trace",
    "evaluate",
    "read_traces",
    "summarize",
    "write_report",
]
