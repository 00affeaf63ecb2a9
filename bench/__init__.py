"""The ``kvtier`` command line: plan, bench, demo, serve."""
