"""The loop's program tasks, one file per program, each declaring its ``ProgramTask`` in ``PLUGINS``.

The registry (:data:`kitune.optimizers.program_task.PROGRAM_TASKS`) imports every module here on
first use and registers each one's ``PLUGINS`` map: adding a tunable program is one new file in
this folder (plus its packaged prompt ``kitune/prompts/<name>.txt``, or ``ProgramTask.instruction``,
and its tests).
"""
