"""Serving, the lowest service tier: what ``context``, ``serve``, ``mcp`` and the store admin run.

``get_context`` (:mod:`~kitune.service.serving.context`), which prompt versions and KI table
serve (:mod:`~kitune.service.serving.prompts`), the KI store's admin
(:mod:`~kitune.service.serving.stores`) and export (:mod:`~kitune.service.serving.export`), and
the MCP tools' bodies (:mod:`~kitune.service.serving.mcp`). It imports no other service tier
(AGENTS.md, ``tests/test_layering.py``).
"""
