"""The choice: a routing policy over the live directory and the engines' queues.

The default policy is figure 7's score (the others: :mod:`.policies`)::

    w* = argmax_j [ mu * saved_j / S  -  (1 - mu) * (L_j / L_max) ** gamma ]

``saved_j``: the tier-weighted tokens engine j holds as a prefix of the request
(:meth:`.directory.BlockDirectory.match`); ``S``: the prompt's tokens; ``L_j``: engine j's load
(:attr:`.pool.Engine.load`); ``L_max``: the configured cap, else the largest candidate load (at
least 1).  The score itself is :func:`kvtier.tiering.prefix.score.choose` (ties: lower load, then
in turn).  A request whose tokens are unknown has S = 0 and routes on load alone.
The request's trajectory key (:func:`.policies.trajectory_key`) is passed to the policy.
Candidates are the engines that are up, less those a caller excludes (one whose connection
just failed).  Block hashes are computed once per block size (vLLM's GPU events tell each
engine's; the configured one before they do).  Call on the proxy's loop only (the policy keeps
its state there).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Sequence

from kvtier.tiering.prefix.score import Weights

from .directory import BlockDirectory, Match
from .hashing import BlockHasher
from .policies import Candidate, Policy, PrefixLoad
from .pool import Engine, EnginePool


class NoEngine(RuntimeError):
    """No engine is up (or every one was excluded)."""


@dataclass(frozen=True)
class Decision:
    """The winner, and per candidate its match, load and score."""

    engine: Engine
    prompt_tokens: int
    matches: dict[str, Match]
    loads: dict[str, float]
    scores: dict[str, float]

    @property
    def match(self) -> Match:
        return self.matches[self.engine.name]


class Router:
    """See the module docstring."""

    def __init__(self, directory: BlockDirectory, pool: EnginePool, hasher: BlockHasher, *,
                 weights: Weights = Weights(), load_max: float | None = None, block_size: int = 16,
                 policy: Policy | None = None) -> None:
        self.directory, self.pool, self.hasher = directory, pool, hasher
        self.weights, self.load_max, self.block_size = weights, load_max, block_size
        self.policy = policy if policy is not None else PrefixLoad(weights, load_max)

    def hashes(self, tokens: Sequence[int], sizes: Collection[int], salt: str | None = None) -> dict[int, list[int]]:
        """The block hashes of ``tokens`` for each block size, with the request's ``cache_salt``
        (CPU work: run off the loop).  Raises ValueError for a salt that is not a string."""
        return {bs: self.hasher.hashes(tokens, bs, salt=salt) for bs in sizes}

    def block_sizes(self, engines: Sequence[Engine]) -> dict[str, int]:
        return {e.name: self.directory.block_size(e.name) or self.block_size for e in engines}

    def choose(self, prompt_tokens: int, hashes: dict[int, list[int]], *,
               exclude: Collection[str] = (), key: str | None = None) -> Decision:
        """Pick the engine.  ``hashes``: block size -> the request's hashes (from :meth:`hashes`;
        empty when the tokens are unknown); ``key``: its trajectory.  Raises NoEngine."""
        cands = [e for e in self.pool.up() if e.name not in exclude]
        if not cands:
            raise NoEngine("no engine is up" if not self.pool.up() else "every engine that is up failed")
        sizes = self.block_sizes(cands)
        matches = {e.name: self.directory.match(e.name, hashes.get(sizes[e.name], ()), sizes[e.name])
                   for e in cands}
        c = self.policy.pick([Candidate(e.name, matches[e.name].saved_tokens, e.load) for e in cands],
                             prompt_tokens, key)
        return Decision(cands[c.index], prompt_tokens, matches, {e.name: e.load for e in cands},
                        {e.name: s for e, s in zip(cands, c.scores)})
