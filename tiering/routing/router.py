"""The choice: figure 7's score over the live directory and the engines' queues.

::

    w* = argmax_j [ mu * saved_j / S  -  (1 - mu) * (L_j / L_max) ** gamma ]

``saved_j``: the tier-weighted tokens engine j holds as a prefix of the request
(:meth:`.directory.BlockDirectory.match`); ``S``: the prompt's tokens; ``L_j``: engine j's load
(:attr:`.pool.Engine.load`); ``L_max``: the configured cap, else the largest candidate load (at
least 1).  The score itself is :func:`kvtier.tiering.prefix.score.choose` (ties: lower load, then
the engine given first).  A request whose tokens are unknown has S = 0 and routes on load alone.
Candidates are the engines that are up, less those a caller excludes (one whose connection
just failed).  Block hashes are computed once per block size (vLLM's GPU events tell each
engine's; the configured one before they do).  Pure given its inputs; call on the proxy's loop.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Sequence

from kvtier.tiering.prefix.score import Weights, choose

from .directory import BlockDirectory, Match
from .hashing import BlockHasher
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
                 weights: Weights = Weights(), load_max: float | None = None, block_size: int = 16) -> None:
        self.directory, self.pool, self.hasher = directory, pool, hasher
        self.weights, self.load_max, self.block_size = weights, load_max, block_size

    def hashes(self, tokens: Sequence[int], sizes: Collection[int]) -> dict[int, list[int]]:
        """The block hashes of ``tokens`` for each block size (CPU work: run off the loop)."""
        return {bs: self.hasher.hashes(tokens, bs) for bs in sizes}

    def block_sizes(self, engines: Sequence[Engine]) -> dict[str, int]:
        return {e.name: self.directory.block_size(e.name) or self.block_size for e in engines}

    def choose(self, prompt_tokens: int, hashes: dict[int, list[int]], *,
               exclude: Collection[str] = ()) -> Decision:
        """Pick the engine.  ``hashes``: block size -> the request's hashes (from :meth:`hashes`;
        empty when the tokens are unknown).  Raises NoEngine."""
        cands = [e for e in self.pool.up() if e.name not in exclude]
        if not cands:
            raise NoEngine("no engine is up" if not self.pool.up() else "every engine that is up failed")
        sizes = self.block_sizes(cands)
        matches = {e.name: self.directory.match(e.name, hashes.get(sizes[e.name], ()), sizes[e.name])
                   for e in cands}
        loads = [e.load for e in cands]
        c = choose([matches[e.name].saved_tokens for e in cands], loads, prompt_tokens, self.weights,
                   self.load_max)
        return Decision(cands[c.index], prompt_tokens, matches, {e.name: e.load for e in cands},
                        {e.name: s for e, s in zip(cands, c.scores)})
