"""Moved to :mod:`kvtier.util.args` (shared by the CLI and the benchmarks); kept as an alias."""
from kvtier.util.args import (ensure_dir, fraction, int_like, nonneg_float, nonneg_int,  # noqa: F401
                              png_path, pos_float, pos_int, prob, share, typed)
