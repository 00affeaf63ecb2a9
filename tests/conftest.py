"""The test run's options: ``--engines-required`` (tests/engines.py)."""
from __future__ import annotations

from engines import FLAG, Requirement


def pytest_addoption(parser) -> None:
    parser.addoption(FLAG, action="store_true", default=False,
                     help="fail, rather than skip, a test whose engine (vLLM, SGLang) is not installed")


def pytest_configure(config) -> None:
    Requirement.required = bool(config.getoption(FLAG))
