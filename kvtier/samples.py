"""Where the trace commands read their input: a file named on the command line, the
full public traces under ``$KVTIER_TRACES``, or the small samples shipped in the package.

Precedence (the same for every trace command): the flag (``--input FILE`` /
``--traces DIR``) > ``$KVTIER_TRACES`` > the packaged sample.  The samples live in
``kvtier/data/traces`` with their licence notices (``NOTICE.md``); the full traces'
addresses are in :data:`FULL_TRACES`.
"""
from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

# source -> (the full trace's path under $KVTIER_TRACES, the sample's path in the package, URL)
FULL_TRACES: dict[str, tuple[str, str, str]] = {
    "mooncake": ("mooncake/conversation_trace.jsonl", "mooncake/conversation_trace.sample.jsonl",
                 "https://raw.githubusercontent.com/kvcache-ai/Mooncake/main/FAST25-release/traces/"
                 "conversation_trace.jsonl"),
    "tracelab": ("tracelab/example_sanitized_round_trace.jsonl", "tracelab/example_sanitized_round_trace.jsonl",
                 "https://github.com/uw-syfi/TraceLab (example_sessions/sanitized/round_trace.jsonl; "
                 "the full dataset is a release asset)"),
}


@dataclass(frozen=True)
class TraceInput:
    """One resolved input: the path, and where it came from ("--input", "KVTIER_TRACES", "sample")."""

    path: Path
    origin: str

    @property
    def is_sample(self) -> bool:
        return self.origin == "sample"


def sample_dir() -> Path:
    """The packaged samples' directory (laid out like the full traces' directory)."""
    return Path(str(resources.files("kvtier") / "data" / "traces"))


def trace_input(source: str, explicit: str | None) -> TraceInput:
    """The input of ``kvtier bench trace SOURCE``.

    Raises:
        FileNotFoundError: the file named by the flag or under ``$KVTIER_TRACES`` does not exist
            (the message names it and where the name came from).
    """
    from kvtier import env

    full, sample, url = FULL_TRACES[source]
    root = None if explicit else env.get("KVTIER_TRACES")
    if explicit:
        found = TraceInput(Path(explicit), "--input")
    elif root:
        found = TraceInput(Path(root) / full, "KVTIER_TRACES")
    else:
        return TraceInput(sample_dir() / sample, "sample")
    if not found.path.is_file():
        raise FileNotFoundError(f"input trace not found: {found.path} (from {found.origin}); "
                                f"the public trace is at {url}")
    return found


def traces_input(explicit: str | None) -> TraceInput:
    """The directory ``kvtier bench predictor`` reads per-call tool durations from.

    Raises:
        FileNotFoundError: the directory named by the flag or by ``$KVTIER_TRACES`` does not exist.
    """
    from kvtier import env

    root = None if explicit else env.get("KVTIER_TRACES")
    if explicit:
        found = TraceInput(Path(explicit), "--traces")
    elif root:
        found = TraceInput(Path(root), "KVTIER_TRACES")
    else:
        return TraceInput(sample_dir(), "sample")
    if not found.path.is_dir():
        raise FileNotFoundError(f"trace directory {found.path} (from {found.origin}) does not exist")
    return found


def sample_note(source: str) -> str:
    """One line saying a packaged sample was read and where the full trace is."""
    full, _, url = FULL_TRACES[source]
    return (f"read the packaged {source} sample; for the full trace pass --input FILE "
            f"(or set KVTIER_TRACES to a directory holding {full}): {url}")
