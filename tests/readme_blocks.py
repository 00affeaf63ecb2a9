"""The README's code blocks, as the README test runs them.

A fenced block is one of ``bash``, ``console`` or ``python``. An HTML comment on the line before
a block steers how it runs:

- ``<!-- readme-test: skip: REASON -->``: not run (a GPU, an engine this machine cannot run, or
  the test run itself); the reason is shown as the skip's reason.
- ``<!-- readme-test: live -->``: run by ``tests/live/test_live_readme.py`` in vLLM's CPU
  environment, not by the main suite.
- ``<!-- readme-test: repo -->``: run in the repository root instead of a scratch folder.

A ``bash`` block runs as one script. A command that ends in ``&`` is a server started in the
background: the script then waits until the port named by its ``--port N`` accepts connections,
and every background job is stopped when the script ends. A ``console`` block's ``$ `` line is
run and its first output line is compared with the README's.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
_FENCE = re.compile(r"^```(\w*)\s*$")
_MARK = re.compile(r"^<!--\s*readme-test:\s*(\w+)(?::\s*(.*?))?\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    lang: str
    text: str
    line: int               # 1-based line of the opening fence
    mark: str | None        # skip / live / repo, or None
    reason: str | None

    @property
    def name(self) -> str:
        return f"README.md:{self.line}:{self.lang}"


def blocks(path: Path = README) -> list[Block]:
    """Every fenced ``bash``/``console``/``python`` block of ``path``, in order.

    Raises:
        ValueError: a fence is never closed, or a mark names an unknown kind.
    """
    lines = path.read_text().splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m or not m.group(1):
            i += 1
            continue
        lang, start = m.group(1), i
        j = i + 1
        while j < len(lines) and lines[j].strip() != "```":
            j += 1
        if j == len(lines):
            raise ValueError(f"README.md:{start + 1}: fence never closed")
        mark = reason = None
        if start > 0 and (mm := _MARK.match(lines[start - 1])):
            mark, reason = mm.group(1), mm.group(2)
            if mark not in ("skip", "live", "repo"):
                raise ValueError(f"README.md:{start}: unknown readme-test mark {mark!r}")
        if lang in ("bash", "console", "python"):
            out.append(Block(lang, "\n".join(lines[start + 1:j]) + "\n", start + 1, mark, reason))
        i = j + 1
    return out


_BG = re.compile(r"&\s*(#.*)?$")
_PORT = re.compile(r"--port\s+(\d+)")

PRELUDE = """set -euo pipefail
trap 'kill $(jobs -p) 2>/dev/null || true; wait' EXIT
__wait_port() {  # a background server's port accepts connections, or its job ended
  for _ in $(seq 1 1200); do
    (exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return 0
    [ -n "$(jobs -rp)" ] || { echo "background server ended before port $1 opened" >&2; return 1; }
    sleep 0.5
  done
  echo "port $1 never opened" >&2; return 1
}
"""


def bash_script(block: Block) -> str:
    """The block as a script: the prelude, then its lines, with a wait after each server start.

    Logical lines (a trailing ``\\``, or an open single quote) are joined before looking for
    the ``&`` that starts a server.

    Raises:
        ValueError: a background command names no ``--port``.
    """
    out = [PRELUDE]
    logical: list[str] = []
    for line in block.text.splitlines():
        logical.append(line)
        joined = "\n".join(logical)
        if line.endswith("\\") or joined.count("'") % 2 == 1:
            continue
        out.append(joined)
        if _BG.search(joined):
            port = _PORT.search(joined)
            if port is None:
                raise ValueError(f"{block.name}: a background command without --port")
            out.append(f"__wait_port {port.group(1)}")
        logical = []
    if logical:
        out.append("\n".join(logical))
    return "\n".join(out) + "\n"


def console_command(block: Block) -> tuple[str, str]:
    """The ``$ `` command of a console block and the first line the README shows it print.

    Raises:
        ValueError: the block has no ``$ `` line or no output line.
    """
    lines = block.text.splitlines()
    cmds = [k for k, ln in enumerate(lines) if ln.startswith("$ ")]
    if not cmds or cmds[0] + 1 >= len(lines):
        raise ValueError(f"{block.name}: a console block needs a '$ ' line and its output")
    k = cmds[0]
    return lines[k][2:], lines[k + 1]
