"""The ``kvtier`` command line: ``main`` (dispatch) and the product commands
(``demo``, ``serve``, ``plan``).  Benchmark subcommands live in
:mod:`kvtier.bench` and register themselves the same way."""
