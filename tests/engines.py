"""The inference engines the plugin tests need: an engine that is not installed skips, nothing else does.

``need_engine("vllm")`` at the top of a test module (or in a test) looks the
engine's own package up.  If it is missing, the test skips with the install
hint, and under ``pytest --engines-required`` (CI, where ``ci/test.sh``
installs the engines) it fails instead.  Only the engine's absence is a skip:
kvtier's own modules are imported by the test module as usual, after this
call, so a broken kvtier module is an error, never a skip; so is an installed
engine that fails to import.

``gpu_install(what, exc)`` skips where an engine part needs its GPU install
(SGLang's metrics import torchvision's CUDA operators): a hardware limit, like
the ``cuda`` marker, so the flag does not turn it into a failure.

The flag is a pytest option (tests/conftest.py), not an environment variable:
the tests run kvtier's CLI, which warns about every ``KVTIER_*`` variable it
does not know.
"""
from __future__ import annotations

import importlib.util

import pytest

INSTALL = "pip install --no-deps -r ci/requirements-engines.txt"
FLAG = "--engines-required"


class Requirement:
    """Whether a missing engine fails (set once per run from the pytest option)."""

    required = False


def required() -> bool:
    return Requirement.required


def need_engine(package: str) -> None:
    """Go on only where the engine's top-level package (``vllm``, ``sglang``) is
    installed.  It is looked up, not imported: kvtier's plugins import an
    engine their own way (SGLang's storage modules without its front end), and
    whatever that import raises is the test's error.

    Raises:
        pytest.skip.Exception: it is not installed.
        pytest.fail.Exception: it is not installed and the run has ``--engines-required``.
    """
    if importlib.util.find_spec(package) is not None:
        return
    msg = f"{package} is not installed ({INSTALL})"
    if required():
        pytest.fail(f"{msg}, and the run has {FLAG}", pytrace=False)
    pytest.skip(msg, allow_module_level=True)


def gpu_install(what: str, exc: BaseException) -> None:
    """Skip: ``what`` needs the engine's GPU install here (never a failure, as a CUDA test)."""
    pytest.skip(f"{what} needs the engine's GPU install: {type(exc).__name__}: {exc}")
