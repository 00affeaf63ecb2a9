"""Moved to :mod:`kvtier.util.console` (shared by the CLI and the benchmarks); kept as an alias."""
from kvtier.util.console import MIN_WIDTH, PIPE_WIDTH, console_width, fit_table, make_console  # noqa: F401
