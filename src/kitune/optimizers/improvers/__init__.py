"""The improve step's rooms, one file per improver, each declaring its ``Improver`` in ``PLUGINS``.

Built-ins: ``prompts`` (the configured optimiser on each tuned program's task), ``knobs`` (Optuna
over the retrieval knobs with an LLM-free objective), ``disambiguation`` (feedback KIs from the
tuning failures, routed by failure kind). ``optimize.improvers`` says which run, in which order.
"""
