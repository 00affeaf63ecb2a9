"""Small neutral helpers shared by the product (``kvtier.cli``, the store, the policy) and the
benchmarks (``kvtier.bench``).  Nothing here imports torch, ``kvtier.store`` or ``kvtier.bench``:

=============================  ============================================================
``kvtier.util.cmd``            command plumbing: CliError, the JSON output, command groups
``kvtier.util.args``           argparse value types and path checks
``kvtier.util.console``        the one rich console (``bench`` extra)
``kvtier.util.stats``          the one percentile helper
``kvtier.util.breaker``        the one circuit breaker
``kvtier.util.pagecache``      dropping a file's pages from the page cache
``kvtier.util.validate``       checks of configuration values (one line naming the key)
``kvtier.util.choices``        the member of a mode enum a setting names (one line naming it)
``kvtier.util.tiers``          the one tier enum (device, host, nvme, remote)
=============================  ============================================================
"""
