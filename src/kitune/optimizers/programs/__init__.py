"""The loop's program tasks, one file per program, each registering its ``ProgramTask``.

The registry (:data:`kitune.optimizers.program_task.PROGRAM_TASKS`) imports every module here on
first use: adding a tunable program is one new file in this folder (plus its packaged prompt
``kitune/prompts/<name>.txt`` and its tests).
"""
