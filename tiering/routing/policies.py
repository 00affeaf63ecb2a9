"""Routing policies: which of the candidate engines gets a request.

Every policy sees the same thing per request: the candidates (engines up and not excluded, in the
order given), each with its tier-weighted prefix match and its load, the prompt's tokens, and
the request's trajectory key (below).  It returns the winner's index and a score per candidate
(larger is better; what the score means is the policy's)::

    prefix-load   figure 7's score, mu * saved/S - (1 - mu) * (L/L_max)^gamma (the seed's router)
    round-robin   the next candidate in turn, whatever it holds or carries
    least-loaded  the smallest load; ties go round in turn
    sticky        a trajectory stays on the engine of its first request; a new trajectory, or
                  one whose engine is out, goes to the least-loaded engine and stays there

The trajectory key (:func:`trajectory_key`): kvtier's hint ``kv_transfer_params.kvtier.
trajectory_id`` when the request carries one, else ``"block:"`` and the request's first block
hash (so sessions that share a first block share a key), else None (sticky routes it as
least-loaded and remembers nothing).

Policies with state (round-robin's turn, least-loaded's tie turn, sticky's map) are used on the
proxy's event loop only: not thread-safe.  ``sticky`` remembers at most ``max_keys`` trajectories
(the oldest used is forgotten first: its next request is placed afresh).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from kvtier.tiering.prefix.score import Weights, choose


@dataclass(frozen=True)
class Candidate:
    """One engine as a policy sees it: its name, the tier-weighted prefix tokens it holds, its load."""

    name: str
    saved_tokens: float
    load: float


@dataclass(frozen=True)
class Pick:
    """The winner's index among the candidates, and each candidate's score (candidate order)."""

    index: int
    scores: tuple[float, ...]


class Policy(ABC):
    """Picks one of the candidates.  ``pick`` raises ValueError for no candidates; it may
    update the policy's own state (event-loop thread only)."""

    name: str = ""

    @abstractmethod
    def pick(self, cands: Sequence[Candidate], prompt_tokens: int, key: str | None) -> Pick:
        """The winner for a request of ``prompt_tokens`` tokens with trajectory ``key``."""


def _check(cands: Sequence[Candidate]) -> None:
    if not cands:
        raise ValueError("a policy needs at least one candidate")


class PrefixLoad(Policy):
    """Figure 7's score (:func:`kvtier.tiering.prefix.score.choose`); ties: lower load, then, among
    equal scores and loads, the one after the last tie's winner (so an idle cluster's new
    sessions are not all sent to the first engine)."""

    name = "prefix-load"

    def __init__(self, weights: Weights = Weights(), load_max: float | None = None) -> None:
        self.weights, self.load_max = weights, load_max
        self._turn = 0

    def pick(self, cands: Sequence[Candidate], prompt_tokens: int, key: str | None) -> Pick:
        _check(cands)
        c = choose([x.saved_tokens for x in cands], [x.load for x in cands], prompt_tokens, self.weights,
                   self.load_max)
        best = (c.scores[c.index], cands[c.index].load)
        tied = [j for j, x in enumerate(cands) if (c.scores[j], x.load) == best]
        i = tied[self._turn % len(tied)]
        if len(tied) > 1:
            self._turn += 1
        return Pick(i, c.scores)


class RoundRobin(Policy):
    """The candidates in turn (a counter over requests, modulo the candidates now up).
    Scores: 1 for the winner, 0 for the others."""

    name = "round-robin"

    def __init__(self) -> None:
        self._turn = 0

    def pick(self, cands: Sequence[Candidate], prompt_tokens: int, key: str | None) -> Pick:
        _check(cands)
        i = self._turn % len(cands)
        self._turn += 1
        return Pick(i, tuple(float(j == i) for j in range(len(cands))))


class LeastLoaded(Policy):
    """The smallest load; among equal loads, the one after the last tie's winner (so an idle
    cluster is not all sent to the first engine).  Scores: minus the load."""

    name = "least-loaded"

    def __init__(self) -> None:
        self._turn = 0

    def pick(self, cands: Sequence[Candidate], prompt_tokens: int, key: str | None) -> Pick:
        _check(cands)
        low = min(x.load for x in cands)
        tied = [j for j, x in enumerate(cands) if x.load == low]
        i = tied[self._turn % len(tied)]
        self._turn += 1
        return Pick(i, tuple(-x.load for x in cands))


class Sticky(Policy):
    """A trajectory's requests go to the engine its first request went to, while that engine is a
    candidate; otherwise (new key, engine out or excluded) the least-loaded one, remembered for
    the key.  A request without a key is placed as least-loaded and nothing is remembered.
    Scores: 1 for the winner, 0 for the others.  Raises ValueError for ``max_keys`` < 1."""

    name = "sticky"

    def __init__(self, max_keys: int = 100_000) -> None:
        if max_keys < 1:
            raise ValueError(f"max_keys must be >= 1, got {max_keys}")
        self.max_keys = max_keys
        self._home: OrderedDict[str, str] = OrderedDict()
        self._fallback = LeastLoaded()
        self.moved = 0          # trajectories sent away from their engine (it was not a candidate)

    def home(self, key: str) -> str | None:
        """The engine ``key`` is pinned to, if any (does not count as a use)."""
        return self._home.get(key)

    def pick(self, cands: Sequence[Candidate], prompt_tokens: int, key: str | None) -> Pick:
        _check(cands)
        names = [x.name for x in cands]
        home = self._home.get(key) if key is not None else None
        if home in names:
            i = names.index(home)
            self._home.move_to_end(key)
        else:
            i = self._fallback.pick(cands, prompt_tokens, None).index
            if key is not None:
                self.moved += home is not None
                self._home[key] = names[i]
                self._home.move_to_end(key)
                while len(self._home) > self.max_keys:
                    self._home.popitem(last=False)
        return Pick(i, tuple(float(j == i) for j in range(len(cands))))


POLICIES: dict[str, Callable[..., Policy]] = {
    PrefixLoad.name: PrefixLoad, RoundRobin.name: RoundRobin, LeastLoaded.name: LeastLoaded, Sticky.name: Sticky}
"""Every policy by name (``kvtier route --policy NAME``)."""


def make_policy(name: str, *, weights: Weights = Weights(), load_max: float | None = None) -> Policy:
    """A fresh policy by name (``weights`` and ``load_max`` are prefix-load's).  Raises ValueError
    for an unknown name, listing the known ones."""
    if name not in POLICIES:
        raise ValueError(f"unknown routing policy {name!r}; known: {', '.join(POLICIES)}")
    if name == PrefixLoad.name:
        return PrefixLoad(weights, load_max)
    return POLICIES[name]()


def trajectory_key(doc: Mapping[str, Any], first_hash: int | None) -> str | None:
    """A request's trajectory key (module doc): ``doc`` is its JSON body, ``first_hash`` its first
    block's hash (None: no full block, or tokens unknown).  Pure; never raises for odd bodies."""
    params = doc.get("kv_transfer_params")
    hint = params.get("kvtier") if isinstance(params, dict) else None
    tid = hint.get("trajectory_id") if isinstance(hint, dict) else None
    if isinstance(tid, str) and tid:
        return "trajectory:" + tid
    return f"block:{first_hash}" if first_hash is not None else None
