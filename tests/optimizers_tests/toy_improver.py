"""A toy improver added by this one file: importing it registers ``toy-knob`` in the improver registry.

It proposes ``retrieval.rrf_k = 7``, counts its calls and notes the iteration it saw.
"""

from __future__ import annotations

from kitune.optimizers.improve_env import ImproveEnv, ImproveInput, Improvement
from kitune.optimizers.improver import register_improver


class ToyKnob:
    name = "toy-knob"

    def __init__(self) -> None:
        self.calls = 0

    def improve(self, env: ImproveEnv, inp: ImproveInput) -> Improvement:
        self.calls += 1
        return Improvement(
            knobs={"retrieval.rrf_k": 7},
            metrics={"toy_calls": float(self.calls)},
            notes={"toy": f"saw iteration {inp.iteration} with {len(inp.failures)} failure(s)"},
        )


TOY = register_improver(ToyKnob())
