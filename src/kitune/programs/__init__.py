"""The optimisable DSPy programs, one per file.

Each program's named predictor carries the instruction text that the optimisers rewrite; the
starting texts live in ``kitune/prompts/*.txt`` and are versioned by content hash
(:func:`kitune.programs.instructions.load_instruction`).
"""

from __future__ import annotations

from kitune.programs.disambiguator import DisambiguationResult, Disambiguator, accept_if_retrieved
from kitune.programs.fact_extractor import DocExtraction, FactExtractor
from kitune.programs.instructions import Instruction, load_instruction
from kitune.programs.judge import Judge, JudgeVerdict, judge_answer
from kitune.programs.query_rewriter import QueryRewriter, RewriteResult

__all__ = [
    "DisambiguationResult",
    "Disambiguator",
    "DocExtraction",
    "FactExtractor",
    "Instruction",
    "Judge",
    "JudgeVerdict",
    "QueryRewriter",
    "RewriteResult",
    "accept_if_retrieved",
    "judge_answer",
    "load_instruction",
]
