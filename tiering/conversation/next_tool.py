"""Which tool a trajectory calls next, learned from the traffic.

The hint rides on the request, but the tool of the pause after it is only
known once the response names it; so at request time the router forwards
the tool the trajectory most likely calls next::

    transitions[agent][last tool] -> the most frequent next tool     ("transition")
    else the trajectory's most frequent tool                         ("trajectory")
    else the agent's most frequent tool                              ("agent")
    else None: no hint, the engine's unhinted class                  ("none")

``last tool`` is the tool whose results the request carries (None on a
first turn: the agent's opening move is a transition too).  An agent is a
system prompt and tool list (:class:`~.naming.Names`), so what one run
learned serves the next run of the same agent.

Bounded whatever names clients invent: at most ``max_agents`` agents and
``max_trajectories`` trajectories (least recently used forgotten), at most
``max_rows`` last-tool rows per agent, and every count table keeps at most
``max_next`` names (a space-saving table: a new name replaces the least
counted one, so the frequent names stay).  Not thread-safe (its owner locks).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


@dataclass(frozen=True)
class NextTool:
    """A forecast: ``tool`` (None: no forecast) and which table gave it."""

    tool: str | None
    source: str     # "transition", "trajectory", "agent" or "none"


class TopCounts:
    """Counts of at most ``cap`` names (space-saving: a new name past the cap
    takes the least counted one's place with its count + 1)."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._c: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._c)

    def add(self, name: str) -> None:
        c = self._c
        if name in c or len(c) < self.cap:
            c[name] = c.get(name, 0) + 1
            return
        low = min(c, key=c.__getitem__)
        c[name] = c.pop(low) + 1

    def top(self) -> str | None:
        """The most counted name (ties: the one counted first), None when empty."""
        return max(self._c, key=self._c.__getitem__) if self._c else None


class _Lru(Generic[K, V]):
    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.d: OrderedDict[K, V] = OrderedDict()

    def get(self, k: K) -> V | None:
        v = self.d.get(k)
        if v is not None:
            self.d.move_to_end(k)
        return v

    def setdefault(self, k: K, make) -> V:
        v = self.get(k)
        if v is None:
            v = self.d[k] = make()
            while len(self.d) > self.cap:
                self.d.popitem(last=False)
        return v


class _Agent:
    def __init__(self, max_rows: int, max_next: int) -> None:
        self.freq = TopCounts(max_next)
        self.rows: _Lru[str | None, TopCounts] = _Lru(max_rows)


class NextToolForecaster:
    """See the module doc.  ``observe`` mutates; ``forecast`` only reads (and
    refreshes recency)."""

    def __init__(self, *, max_agents: int = 64, max_rows: int = 256, max_next: int = 16,
                 max_trajectories: int = 20_000) -> None:
        if min(max_agents, max_rows, max_next, max_trajectories) < 1:
            raise ValueError("every NextToolForecaster limit must be >= 1")
        self.max_rows, self.max_next = max_rows, max_next
        self._agents: _Lru[str, _Agent] = _Lru(max_agents)
        self._trajs: _Lru[str, TopCounts] = _Lru(max_trajectories)

    def observe(self, agent: str, trajectory: str, last: str | None, tool: str) -> None:
        """``trajectory`` (of ``agent``) called ``tool`` after ``last`` (None: first call)."""
        a = self._agents.setdefault(agent, lambda: _Agent(self.max_rows, self.max_next))
        a.rows.setdefault(last, lambda: TopCounts(self.max_next)).add(tool)
        a.freq.add(tool)
        self._trajs.setdefault(trajectory, lambda: TopCounts(self.max_next)).add(tool)

    def forecast(self, agent: str, trajectory: str, last: str | None) -> NextTool:
        """The tool ``trajectory`` most likely calls after ``last``."""
        a = self._agents.get(agent)
        row = a.rows.get(last) if a is not None else None
        if row is not None and row.top() is not None:
            return NextTool(row.top(), "transition")
        t = self._trajs.get(trajectory)
        if t is not None and t.top() is not None:
            return NextTool(t.top(), "trajectory")
        if a is not None and a.freq.top() is not None:
            return NextTool(a.freq.top(), "agent")
        return NextTool(None, "none")

    def sizes(self) -> dict[str, int]:
        """What is held: agents, last-tool rows, trajectories and counted names."""
        agents = list(self._agents.d.values())
        rows = [r for a in agents for r in a.rows.d.values()]
        return {"agents": len(agents), "rows": len(rows), "trajectories": len(self._trajs.d),
                "names": sum(len(r) for r in rows) + sum(len(a.freq) for a in agents)
                + sum(len(t) for t in self._trajs.d.values())}
