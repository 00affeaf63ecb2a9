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
``prefix-load`` is figure 7's affinity-load objective (kvtier.tiering.prefix.score):
every eligible node scored by ``mu * Match/S - (1 - mu) * (L_j / L_max) ** gamma``, Match
being the round's prompt tokens the node can reuse (the shared prefix it holds; for a
resume, the session's context if the pause left it there in any tier, or what the remote
tier holds of it, on every node), L_j its active rounds and L_max the largest among them.
Routers are deterministic given their seed; not thread-safe (the cluster's
event loop owns them).
"""
from __future__ import annotations

import random
from abc import ABC, abstractmethod
from typing import Protocol, Sequence

from kvtier.bench.sim.trace import Session

ROUTER_NAMES: tuple[str, ...] = ("affinity", "least-loaded", "sticky", "random", "prefix-load")


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

    def prompt_tokens(self, session: Session, k: int) -> int:
        """Round k's prompt: shared prefix + every earlier round's tokens + its new tokens."""

    def held_tokens(self, i: int, session: Session, k: int) -> int:
        """Tokens of round k's prompt node i can reuse instead of prefilling (a prefix)."""


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


class PrefixLoadRouter(Router):
    """Figure 7's affinity-load objective over the eligible nodes (module docstring).  ``mu``
    in [0, 1] (1: where the prefix is, 0: the least loaded), ``gamma`` > 0.  Raises ValueError."""

    name = "prefix-load"

    def __init__(self, mu: float = 0.5, gamma: float = 1.0) -> None:
        from kvtier.tiering.prefix.score import Weights
        self.weights = Weights(mu, gamma)

    def _pick(self, session: Session, k: int, candidates: Sequence[int], view: ClusterView) -> int:
        from kvtier.tiering.prefix.score import choose
        c = choose([view.held_tokens(i, session, k) for i in candidates],
                   [view.active(i) for i in candidates], view.prompt_tokens(session, k), self.weights)
        return candidates[c.index]

    def place_new(self, session: Session, view: ClusterView) -> int:
        return self._pick(session, 0, list(range(view.n)), view)

    def place_resume(self, session: Session, home: int, view: ClusterView, own_hbm: int = 0) -> int:
        return self._pick(session, getattr(view, "resume_round", 1), self.resume_candidates(session, home, view),
                          view)


def make_router(name: str, *, seed: int = 0, mu: float = 0.5, gamma: float = 1.0) -> Router:
    """The router registered as ``name`` (one of :data:`ROUTER_NAMES`); ``mu``, ``gamma``:
    prefix-load's weights.  Raises ValueError."""
    if name == "affinity":
        return AffinityRouter()
    if name == "least-loaded":
        return LeastLoadedRouter()
    if name == "sticky":
        return StickyRouter()
    if name == "random":
        return RandomRouter(seed)
    if name == "prefix-load":
        return PrefixLoadRouter(mu, gamma)
    raise ValueError(f"unknown router {name!r}; known routers: {', '.join(ROUTER_NAMES)}")
