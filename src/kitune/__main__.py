"""``python -m kitune`` entry point."""

from kitune.cli import main

main()
