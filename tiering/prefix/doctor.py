"""The prefix doctor: equation (2)'s hit rate per trajectory, and what broke each prefix.

A harness calls :meth:`PrefixDoctor.observe` once per request (or
``kvtier prefix LOG`` replays a log).  For every turn it reports:

* ``prompt_tokens`` and ``matched_tokens``: the longest prefix (whole chunks of
  ``block_tokens``) already prefilled by any earlier request of the log, as a
  prefix cache shared by every trajectory would hold it (nothing evicted);
* ``prev_matched_tokens``: the exact common prefix with the same trajectory's
  previous turn, and where it ends (``first_diff_token`` and the message field
  it falls in, ``first_diff_field``);
* ``cause`` (:mod:`.causes`) and its cost: ``reprefill_tokens``, the tokens of
  the previous prompt prefilled again, and ``reprefill_s`` at the given prefill speed;
  for ``head_volatile``, ``volatile``: what changed, where (:class:`.volatile.VolatileChange`);
  token-only lines are decoded with the doctor's tokenizer to tell it from an edit;
* ``ttl_expired``: the tool wait before this turn exceeded the provider's cache
  time-to-live (the provider's copy is cold; the tokens counted as matched would be
  billed in full: ``ttl_lost_tokens``).

``H = sum(matched) / sum(prompt)`` (equation (2)) per trajectory and overall.
Bounded: at most ``max_trajectories`` trajectories (the least recently seen is
forgotten, its report too) and ``max_hashes`` chunk hashes.  Not thread-safe.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from typing import Iterable, Mapping, Sequence

from kvtier.tiering.prefix.causes import NONE, classify, classify_text
from kvtier.tiering.prefix.chunks import DEFAULT_CHUNK_TOKENS, chunk_hashes, common_prefix
from kvtier.tiering.prefix.render import ByteTokenizer, Rendered, Tokenizer, render, render_tokens
from kvtier.tiering.prefix.volatile import VolatileChange

DEFAULT_MAX_TRAJECTORIES = 100_000
DEFAULT_MAX_HASHES = 5_000_000


@dataclass(frozen=True)
class TurnReport:
    trajectory_id: str
    turn: int
    prompt_tokens: int
    matched_tokens: int
    prev_matched_tokens: int
    cause: str
    first_diff_token: int | None
    first_diff_field: str | None
    reprefill_tokens: int
    reprefill_s: float
    tool_wait_s: float | None
    ttl_expired: bool
    ttl_lost_tokens: int
    volatile: tuple[VolatileChange, ...] = ()

    @property
    def note(self) -> str:
        """What broke the prefix in words: the volatile values for ``head_volatile``, else ''."""
        return "; ".join(v.describe() for v in self.volatile)

    @property
    def hit_rate(self) -> float:
        return self.matched_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def to_json(self) -> dict:
        d = asdict(self)
        del d["trajectory_id"]
        d["reprefill_s"] = round(self.reprefill_s, 6)
        d["volatile"] = [asdict(v) for v in self.volatile]
        return d


@dataclass
class TrajectoryReport:
    trajectory_id: str
    turns: list[TurnReport] = field(default_factory=list)

    @property
    def prompt_tokens(self) -> int:
        return sum(t.prompt_tokens for t in self.turns)

    @property
    def matched_tokens(self) -> int:
        return sum(t.matched_tokens for t in self.turns)

    @property
    def hit_rate(self) -> float:
        p = self.prompt_tokens
        return self.matched_tokens / p if p else 0.0


def hit_rate(turns: Iterable[TurnReport]) -> float:
    """Equation (2): sum of matched over sum of prompt tokens (0 for no tokens)."""
    m = p = 0
    for t in turns:
        m += t.matched_tokens
        p += t.prompt_tokens
    return m / p if p else 0.0


@dataclass
class _Last:
    request: Mapping | None
    rendered: Rendered
    ts: float | None


class PrefixDoctor:
    """See the module docstring.  ``seconds_per_token``: prefill seconds per token (the cost
    model's ``t_recompute(geom, 1, hw)``); ``ttl_s``: the provider cache's time-to-live
    (None: not checked).  Raises ValueError for a bad argument."""

    def __init__(self, tokenizer: Tokenizer | None = None, *, block_tokens: int = DEFAULT_CHUNK_TOKENS,
                 seconds_per_token: float = 0.0, ttl_s: float | None = None,
                 max_trajectories: int = DEFAULT_MAX_TRAJECTORIES, max_hashes: int = DEFAULT_MAX_HASHES) -> None:
        if block_tokens < 1:
            raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")
        if not seconds_per_token >= 0:
            raise ValueError(f"seconds_per_token must be >= 0, got {seconds_per_token}")
        if ttl_s is not None and not ttl_s > 0:
            raise ValueError(f"ttl_s must be > 0, got {ttl_s}")
        if max_trajectories < 1 or max_hashes < 1:
            raise ValueError("max_trajectories and max_hashes must be >= 1")
        self.tok = tokenizer or ByteTokenizer()
        self.block_tokens = block_tokens
        self.seconds_per_token = seconds_per_token
        self.ttl_s = ttl_s
        self.max_trajectories = max_trajectories
        self.max_hashes = max_hashes
        self._seen: OrderedDict[bytes, None] = OrderedDict()
        self._last: OrderedDict[str, _Last] = OrderedDict()
        self.trajectories: OrderedDict[str, TrajectoryReport] = OrderedDict()

    def observe(self, trajectory_id: str, request: Mapping | None = None, *, tokens: Sequence[int] | None = None,
                tool_wait_s: float | None = None, ts: float | None = None) -> TurnReport:
        """Record one request of ``trajectory_id`` (a chat-completions body, or its token ids)
        and return its turn's report.  ``tool_wait_s``: the tool wait before it (default: the
        gap to the previous turn's ``ts`` when both are given).
        Raises ValueError for neither or both of ``request`` and ``tokens``, or a malformed request."""
        if (request is None) == (tokens is None):
            raise ValueError("give exactly one of request and tokens")
        r = render(request, self.tok) if request is not None else render_tokens(tokens)
        tid = str(trajectory_id)
        last = self._last.get(tid)
        rep = self.trajectories.get(tid)
        if rep is None:
            rep = self.trajectories[tid] = TrajectoryReport(tid)
            while len(self.trajectories) > self.max_trajectories:
                old, _ = self.trajectories.popitem(last=False)
                self._last.pop(old, None)
        else:
            self.trajectories.move_to_end(tid)
        matched = self._match_and_remember(r.tokens)
        if last is None:
            lcp, cause, pos, fld, reprefill = 0, NONE, None, None, 0
        else:
            lcp = common_prefix(last.rendered.tokens, r.tokens)
            extends = lcp == len(last.rendered.tokens)
            if last.request is not None and request is not None:
                cause = classify(last.request, request, extends)
            else:
                cause = classify_text(self._decode(last.rendered.tokens), self._decode(r.tokens), extends)
            pos = None if extends else lcp
            fld = None if extends else (r.label_at(lcp) or last.rendered.label_at(lcp))
            reprefill = 0 if extends else max(0, min(len(last.rendered.tokens), len(r.tokens)) - matched)
        if tool_wait_s is None and last is not None and ts is not None and last.ts is not None:
            tool_wait_s = max(0.0, ts - last.ts)
        expired = bool(last is not None and self.ttl_s is not None and tool_wait_s is not None
                       and tool_wait_s > self.ttl_s)
        t = TurnReport(tid, len(rep.turns), len(r.tokens), matched, lcp, cause.name, pos, fld, reprefill,
                       reprefill * self.seconds_per_token, tool_wait_s, expired, matched if expired else 0,
                       cause.volatile)
        rep.turns.append(t)
        self._last[tid] = _Last(request, r, ts)
        self._last.move_to_end(tid)
        return t

    def _decode(self, tokens: Sequence[int]) -> str | None:
        """A prompt's text by the doctor's tokenizer; None when these are not its ids."""
        try:
            return self.tok.decode(tokens)
        except ValueError:
            return None

    def _match_and_remember(self, tokens: Sequence[int]) -> int:
        chain = chunk_hashes(tokens, self.block_tokens)
        seen = self._seen
        n = 0
        while n < len(chain) and chain[n] in seen:
            n += 1
        for h in chain:
            seen[h] = None
            seen.move_to_end(h)
        while len(seen) > self.max_hashes:
            seen.popitem(last=False)
        return n * self.block_tokens

    def forget(self, trajectory_id: str) -> None:
        """Drop a finished trajectory's state and report (its chunks stay known)."""
        self._last.pop(str(trajectory_id), None)
        self.trajectories.pop(str(trajectory_id), None)

    @property
    def hit_rate(self) -> float:
        return hit_rate(t for r in self.trajectories.values() for t in r.turns)

    def to_json(self) -> dict:
        """The ``kvtier prefix --json`` document."""
        return {"hit_rate": self.hit_rate,
                "tokenizer": self.tok.name,
                "block_tokens": self.block_tokens, "ttl_s": self.ttl_s,
                "seconds_per_token": self.seconds_per_token,
                "trajectories": {tid: {"hit_rate": r.hit_rate, "prompt_tokens": r.prompt_tokens,
                                       "matched_tokens": r.matched_tokens,
                                       "turns": [t.to_json() for t in r.turns]}
                                 for tid, r in self.trajectories.items()}}
