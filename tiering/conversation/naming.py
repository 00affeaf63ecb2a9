"""Naming a conversation: the trajectory id of an OpenAI chat request.

An agent resends its whole conversation on every turn, so the trajectory is
named from what never changes in it::

    root  = sha256(canonical JSON of {system messages, first user message, tools, "user"})
    agent = sha256(canonical JSON of {system messages, tools})   (the same agent on any task)

(canonical JSON: keys sorted, no spaces, UTF-8).  Two runs of the same task
share a root, so each root keeps its *branches*: a branch remembers how many
messages its last request had and a digest of them; a request whose first
``n`` messages digest the same extends that branch (the agent's next turn, or
a retry) and gets its id, any other request of the root opens a new branch::

    turn 1  [S, U]               -> conv-<root>          (branch 1 at n=2)
    turn 2  [S, U, A1, T1]       -> conv-<root>          (extends n=2; now n=4)
    run 2   [S, U]               -> conv-<root>.2        (n=4 digest differs)
    run 2   [S, U, A1', T1']     -> conv-<root>.2

Two runs whose messages are identical so far are one trajectory until they
differ (their KV is the same too).  Bounded: at most ``max_roots`` roots (the
least recently named forgotten) of at most ``max_branches`` branches each.
Not thread-safe (its owner, :class:`~.tracker.ConversationHints`, locks).
"""
from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Mapping, Sequence

from .messages import ConversationError

SYSTEM_ROLES = ("system", "developer")


def canonical(obj: object) -> bytes:
    """``obj`` as canonical JSON bytes.  Raises ConversationError for what JSON cannot hold."""
    try:
        return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False).encode("utf-8", "surrogatepass")
    except (TypeError, ValueError, RecursionError) as exc:
        raise ConversationError(f"not JSON data ({type(exc).__name__})") from None


def _digest(*parts: bytes) -> bytes:
    h = hashlib.sha256()
    for p in parts:
        h.update(len(p).to_bytes(8, "little"))
        h.update(p)
    return h.digest()


@dataclass(frozen=True)
class Names:
    """A request's names: ``trajectory_id`` (<= 40 printable characters) and
    ``agent`` (its system prompt and tools, shared by every task it runs)."""

    trajectory_id: str
    agent: str


@dataclass
class _Branch:
    id: str
    n: int            # messages of its last request
    digest: bytes     # chain digest of those n messages


class TrajectoryNamer:
    """See the module doc.  :meth:`name` mutates (it learns the branch)."""

    def __init__(self, *, max_roots: int = 10_000, max_branches: int = 8) -> None:
        if max_roots < 1 or max_branches < 1:
            raise ValueError("max_roots and max_branches must be >= 1")
        self.max_roots, self.max_branches = max_roots, max_branches
        self._roots: OrderedDict[str, list[_Branch]] = OrderedDict()
        self._opened: dict[str, int] = {}    # root -> branches opened so far (names .2, .3, ...)

    def __len__(self) -> int:
        """Branches held (at most max_roots * max_branches)."""
        return sum(len(b) for b in self._roots.values())

    def name(self, body: Mapping[str, object], messages: Sequence[Mapping[str, object]]) -> Names:
        """The names of a request (``messages``: its checked messages, see
        :func:`~.messages.read_request`).  Raises ConversationError for content
        that is not JSON data."""
        system = [m.get("content") for m in messages if m["role"] in SYSTEM_ROLES]
        first_user = next((m.get("content") for m in messages if m["role"] == "user"), None)
        tools = body.get("tools")
        agent = _digest(canonical({"system": system, "tools": tools})).hex()[:16]
        root = "conv-" + _digest(canonical({"system": system, "user": first_user, "tools": tools,
                                            "client": body.get("user")})).hex()[:24]
        chain = [b""]
        for m in messages:
            chain.append(_digest(chain[-1], canonical(m)))
        branches = self._roots.get(root)
        if branches is None:
            branches = self._roots[root] = []
            while len(self._roots) > self.max_roots:
                old, _ = self._roots.popitem(last=False)
                self._opened.pop(old, None)
        else:
            self._roots.move_to_end(root)
        best = None
        for b in branches:
            if b.n < len(chain) and chain[b.n] == b.digest and (best is None or b.n > best.n):
                best = b
        if best is None:
            k = self._opened.get(root, 0) + 1
            self._opened[root] = k
            best = _Branch(root if k == 1 else f"{root}.{k}", 0, b"")
            branches.append(best)
            if len(branches) > self.max_branches:
                branches.pop(0)
        else:
            branches.remove(best)
            branches.append(best)           # most recently extended last
        best.n, best.digest = len(messages), chain[-1]
        return Names(best.id, agent)
