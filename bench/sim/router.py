"""Routers of the cluster model: which node runs a session's next round.

A router is asked twice per kind of round:

* ``place_new(session, view)`` when a session arrives (round 0);
* ``place_resume(session, home, view, own_hbm)`` when a tool returns,
  ``home`` being the node that ran the previous round (and holds whatever
  state the pause left there: ``own_hbm`` HBM blocks, which the resumed round
  reuses if it stays and frees if it moves, so they are not load that home
  has beyond what any other node would have once it ran the round).

It sees the nodes only through a :class:`ClusterView` (load counts and which
shared prefixes each node holds), never the simulator's internals.  A resumed
round may go only to a node that holds the session's shared prefix (its home
always does: shared prefixes stay resident), so a move never has to rebuild a
system prompt as well.

``sticky`` is least-loaded with a slack of one active round for home.
Routers are deterministic given their seed; not thread-safe (the cluster's
event loop owns them).
"""
from __future__ import annotations

import random
from abc import ABC, abstractmethod
from typing import Protocol, Sequence

from kvtier.bench.sim.trace import Session

ROUTER_NAMES: tuple[str, ...] = ("affinity", "least-loaded", "sticky", "random")


class ClusterView(Protocol):
    """What a router may see of the nodes (indices 0..n-1)."""

    @property
    def n(self) -> int: ...

    def active(self, i: int) -> int:
        """Rounds routed to node i and not yet paused or finished (queued or running)."""

    def hbm_used(self, i: int) -> int:
        """HBM blocks in use on node i."""

    def holds_prefix(self, i: int, prefix_id: str | None) -> bool:
        """Node i has the shared prefix resident (always True for None)."""


class Router(ABC):
    """Where rounds run.  Implementations return a node index in ``range(view.n)``."""

    name: str = "abstract"

    @abstractmethod
    def place_new(self, session: Session, view: ClusterView) -> int: ...

    @abstractmethod
    def place_resume(self, session: Session, home: int, view: ClusterView, own_hbm: int = 0) -> int: ...

    @staticmethod
    def resume_candidates(session: Session, home: int, view: ClusterView) -> list[int]:
        """Nodes a resumed round may go to: those holding its shared prefix (home included)."""
        sp = session.shared_prefix_id
        return [i for i in range(view.n) if i == home or view.holds_prefix(i, sp)]


def least_loaded(view: ClusterView, candidates: Sequence[int], prefer: int | None = None,
                 prefer_own: int = 0) -> int:
    """The candidate with the fewest active rounds, then the least HBM in use; ``prefer``
    wins a tie (a resume stays home when home is as idle as any), then the lowest index.
    ``prefer_own``: HBM blocks on ``prefer`` that belong to the round being placed (its
    retained state), not counted as ``prefer``'s load."""
    def load(i: int) -> tuple[int, int]:
        return view.active(i), view.hbm_used(i) - (prefer_own if i == prefer else 0)

    best = min(candidates, key=lambda i: (*load(i), i))
    if prefer is not None and prefer in candidates and load(prefer) <= load(best):
        return prefer
    return best


class AffinityRouter(Router):
    """Trajectory affinity: a new session goes to the least-loaded node, and every later
    round of it goes back to the node that ran its previous round (where its state is)."""

    name = "affinity"

    def place_new(self, session: Session, view: ClusterView) -> int:
        return least_loaded(view, range(view.n))

    def place_resume(self, session: Session, home: int, view: ClusterView, own_hbm: int = 0) -> int:
        return home


class LeastLoadedRouter(Router):
    """Every round goes to the node with the fewest active rounds (then the least HBM in
    use); a resume stays home only when home is as little loaded as the best node, home's
    HBM counted without the resuming session's own retained blocks."""

    name = "least-loaded"

    def place_new(self, session: Session, view: ClusterView) -> int:
        return least_loaded(view, range(view.n))

    def place_resume(self, session: Session, home: int, view: ClusterView, own_hbm: int = 0) -> int:
        return least_loaded(view, self.resume_candidates(session, home, view), prefer=home, prefer_own=own_hbm)


class StickyRouter(LeastLoadedRouter):
    """Least-loaded, with a slack for home: new sessions go to the least-loaded node, and a resume
    stays home unless home has more than ``slack`` active rounds more than the least-loaded
    eligible node (then it goes there).  Between affinity (never moves) and least-loaded (moves
    for a difference of one round).  Raises ValueError for a negative slack."""

    name = "sticky"

    def __init__(self, slack: int = 1) -> None:
        if not (isinstance(slack, int) and slack >= 0):
            raise ValueError(f"slack must be an integer >= 0, got {slack!r}")
        self.slack = slack

    def place_resume(self, session: Session, home: int, view: ClusterView, own_hbm: int = 0) -> int:
        best = super().place_resume(session, home, view, own_hbm)
        return home if view.active(home) <= view.active(best) + self.slack else best


class RandomRouter(Router):
    """Every round goes to a node drawn uniformly (seeded) among the eligible ones."""

    name = "random"

    def __init__(self, seed: int = 0) -> None:
        self._rng = random.Random(seed)

    def place_new(self, session: Session, view: ClusterView) -> int:
        return self._rng.randrange(view.n)

    def place_resume(self, session: Session, home: int, view: ClusterView, own_hbm: int = 0) -> int:
        c = self.resume_candidates(session, home, view)
        return c[self._rng.randrange(len(c))]


def make_router(name: str, *, seed: int = 0) -> Router:
    """The router registered as ``name`` (one of :data:`ROUTER_NAMES`).  Raises ValueError."""
    if name == "affinity":
        return AffinityRouter()
    if name == "least-loaded":
        return LeastLoadedRouter()
    if name == "sticky":
        return StickyRouter()
    if name == "random":
        return RandomRouter(seed)
    raise ValueError(f"unknown router {name!r}; known routers: {', '.join(ROUTER_NAMES)}")
