"""Tuning, the third service tier: the self-improvement loop as an application.

What ``kitune optimize`` runs: the options (:mod:`~kitune.service.tuning.options`), the wiring
(:mod:`~kitune.service.tuning.optimize`), the loop's environment
(:mod:`~kitune.service.tuning.loop_env`) and its improve-step helpers
(:mod:`~kitune.service.tuning.improve`), the dataset slice
(:mod:`~kitune.service.tuning.slicing`) and what a run saw
(:mod:`~kitune.service.tuning.slice_fingerprint`). It imports the serving and pipelines tiers,
never the workflows (AGENTS.md, ``tests/test_layering.py``).
"""
