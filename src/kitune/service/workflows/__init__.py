"""Workflows, the top service tier: commands that chain the tiers below into one job.

``kitune demo`` (:mod:`~kitune.service.workflows.demo`), ``kitune bootstrap`` (the
``bootstrap*`` modules), ``kitune drift`` (:mod:`~kitune.service.workflows.drift`), and the
production feedback path: traces in (:mod:`~kitune.service.workflows.traces`), failure signals
(:mod:`~kitune.service.workflows.signals`), proposals and their review queue
(:mod:`~kitune.service.workflows.proposals`, :mod:`~kitune.service.workflows.review`), and
``kitune loop``, which watches for new traces and runs the next tuning round
(:mod:`~kitune.service.workflows.watch`). It may import every tier below (AGENTS.md,
``tests/test_layering.py``).
"""
