"""Pipelines, the second service tier: a corpus through the extractor, questions through the agent.

Extraction into the KI store (:mod:`~kitune.service.pipelines.extraction`, ``kitune extract``),
an evaluation run of the budgeted agent (:mod:`~kitune.service.pipelines.evaluation`, ``kitune
eval``) and the store-state-aware evaluation cache (:mod:`~kitune.service.pipelines.eval_cache`).
It imports only the serving tier (AGENTS.md, ``tests/test_layering.py``).
"""
