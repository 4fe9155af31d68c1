"""Issue 37 (6): logging configured once — LiteLLM's INFO lines are not repeated through the root logger."""

from __future__ import annotations

import logging

import litellm  # noqa: F401  # its loggers and handlers as LiteLLM sets them up

from kitune.cli.common import configure_logging


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_litellm_lines_reach_no_root_handler_and_info_is_dropped() -> None:
    root = logging.getLogger()
    seen = _Collect()
    root.addHandler(seen)
    try:
        configure_logging()
        configure_logging()  # idempotent
        lg = logging.getLogger("LiteLLM")
        lg.info("litellm INFO line")
        lg.warning("litellm WARNING line")
        assert seen.lines == []  # not propagated: the MCP server's root handler prints none of them
        assert not lg.isEnabledFor(logging.INFO) and lg.isEnabledFor(logging.WARNING)
    finally:
        root.removeHandler(seen)
