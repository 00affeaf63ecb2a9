"""The strategies a node's :class:`~kvtier.bench.sim.role.Role` supplies, and the lone node's.

* :class:`RemoteFill`: a resumed round without local state loads it from outside
  the node (lone node: :class:`NoRemoteFill`, it recomputes);
* :class:`PrefetchGate`: may hold a planned prefetch (lone node: :class:`OpenGate`);
* :class:`RoundWatch`: told when a round leaves the node's work (lone node: :class:`NoWatch`);
* :class:`Returns`: where a resumed round runs (lone node: ``role.HomeReturns``).

Each is called on the node's event loop (one owner, not thread-safe).
"""
from __future__ import annotations

from typing import Protocol

from kvtier.bench.sim.node import SessionState
from kvtier.bench.sim.transfers import Transfer


class RemoteFill(Protocol):
    """Brings a resumed round's state from outside the node when none is local."""

    def start(self, x: SessionState) -> bool:
        """x's round starts with no local state (its HBM is reserved): start loading what a
        remote copy holds.  True: started (its landing is an ``EventKind.FILL`` event, x waits
        for it); False: nothing to load, or recomputing is sooner (the caller recomputes)."""
        ...

    def landed(self, tr: Transfer) -> None:
        """The fill ``tr`` landed (the node then resumes its round)."""
        ...


class PrefetchGate(Protocol):
    """May hold a prefetch the plan armed."""

    def holds(self, x: SessionState) -> bool:
        """True: x's planned prefetch does not start now (reload on demand at resume; the gate
        counts it).  Called before any other prefetch condition."""
        ...


class RoundWatch(Protocol):
    """Told when a round leaves the node's work (the cluster routers' load signal)."""

    def paused(self, x: SessionState) -> None:
        """x paused (its pause's move is made and its plan armed)."""
        ...

    def finished(self, x: SessionState) -> None:
        """x's last round finished."""
        ...

    def rejecting(self, x: SessionState) -> None:
        """x is about to be rejected (its phase still says where it waited)."""
        ...


class Returns(Protocol):
    """Where a resumed round runs."""

    def returned(self, x: SessionState) -> None:
        """x's tool returned (a live RETURN event): resume its next round, here or elsewhere."""
        ...


class NoRemoteFill:
    """No remote copy anywhere: a round without local state recomputes."""

    def start(self, x: SessionState) -> bool:
        return False

    def landed(self, tr: Transfer) -> None:
        """Raises AssertionError: this fill starts nothing, so nothing of it can land."""
        raise AssertionError("a node without a remote tier started no fill")


class OpenGate:
    """Every planned prefetch may start (subject to the node's own room)."""

    def holds(self, x: SessionState) -> bool:
        return False


class NoWatch:
    """Nobody counts the node's rounds."""

    def paused(self, x: SessionState) -> None:
        pass

    def finished(self, x: SessionState) -> None:
        pass

    def rejecting(self, x: SessionState) -> None:
        pass
