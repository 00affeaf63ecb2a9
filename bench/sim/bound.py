"""Bounds for the pause policies: the exact offline optimum on small traces, and the envelope.

``oracle`` is not a bound.  It knows every wait but decides each pause alone,
with the same cost model as breakeven, so it cannot see the queue on the link,
the admission queue or the round trips its plan triggers, and a fixed rule can
beat it (docs/policy.md).  Two things here are bounds, of different strength:

* :func:`offline_optimum` -- an exact optimum over a *family* of policies on a
  small trace: every assignment of a family member's plan to each pause (its
  decision, and its answers to victim and lease calls for that pause) is
  simulated, all |family|^pauses of them, with full knowledge of the future.
  Assigning one member everywhere replays that member exactly, so no member
  can beat the optimum; mixing plans per pause usually beats them all.
* :func:`envelope` -- on traces too big to search, the best value each metric
  reached in a run over any policy of that run (each metric on its own; no
  single policy need achieve all of them).  No policy of the run beats it;
  how far a policy is from it is what ``--sweep-link`` plots.

Both use :class:`~kvtier.bench.sim.simulator.Simulator` unchanged; pure
Python, one owner, not thread-safe.
"""
from __future__ import annotations

import itertools
from typing import Callable, Mapping, Sequence

from kvtier.tiering.model.decision import Action, Decision, PauseContext, Policy

from kvtier.bench.sim.node import NodeConfig, SimResult
from kvtier.bench.sim.simulator import Simulator
from kvtier.bench.sim.trace import Session

LOWER_IS_BETTER = ("jct_mean_s", "jct_p99_s", "resume_stall_p50_s", "resume_stall_p99_s",
                   "recomputed_tokens", "hbm_idle_gb_s")
HIGHER_IS_BETTER = ("throughput_tokens_per_s",)
MAX_ASSIGNMENTS = 50_000


def _key(ctx: PauseContext) -> tuple:
    return (ctx.trajectory_id, ctx.context_tokens)


class _Recorder(Policy):
    """Wraps one member for a run of its own: remembers its decision at every pause."""

    def __init__(self, inner: Policy) -> None:
        self.inner = inner
        self.name = inner.name
        self.decisions: dict[tuple, Decision] = {}

    def decide(self, ctx: PauseContext) -> Decision:
        d = self.inner.decide(ctx)
        self.decisions[_key(ctx)] = d
        return d

    def observe(self, tool, wait_s, features=None) -> None:
        self.inner.observe(tool, wait_s, features)

    def on_lease_expiry(self, ctx, elapsed_s, current):
        return self.inner.on_lease_expiry(ctx, elapsed_s, current)

    def victim_action(self, ctx) -> Action:
        return self.inner.victim_action(ctx)

    def victim_priority(self, ctx, elapsed_s):
        return self.inner.victim_priority(ctx, elapsed_s)


class _Mixed(Policy):
    """Pause k follows member ``choice[k]``: its recorded decision, and that member's live
    victim order, victim and lease answers.  With one member everywhere this replays the
    member's own run exactly (same decisions, hence the same events and feedback)."""

    name = "offline_optimum"

    def __init__(self, members: Sequence[_Recorder], choice: Mapping[tuple, int]) -> None:
        self.members, self.choice = members, choice

    def _m(self, ctx: PauseContext) -> _Recorder:
        return self.members[self.choice.get(_key(ctx), 0)]

    def decide(self, ctx: PauseContext) -> Decision:
        return self._m(ctx).decisions[_key(ctx)]

    def on_lease_expiry(self, ctx, elapsed_s, current):
        return self._m(ctx).inner.on_lease_expiry(ctx, elapsed_s, current)

    def victim_action(self, ctx) -> Action:
        return self._m(ctx).inner.victim_action(ctx)

    def victim_priority(self, ctx, elapsed_s):
        return self._m(ctx).inner.victim_priority(ctx, elapsed_s)


def offline_optimum(sessions: Sequence[Session], node: NodeConfig, family: Mapping[str, Callable[[], Policy]], *,
                    metric: str = "jct_mean_s") -> tuple[float, dict[str, float], SimResult]:
    """The best ``metric`` over every per-pause mix of ``family``'s plans (lower is better).

    ``family`` maps names to factories of fresh policies.  Every run reveals the true waits
    (``PauseContext.true_wait_s``: the oracle reads it, the others ignore it).  Returns
    (optimum, each member's own value, the optimal run).  Raises ValueError when the
    search would exceed MAX_ASSIGNMENTS runs.
    """
    recs, own = [], {}
    for name, make in family.items():
        rec = _Recorder(make())
        own[name] = Simulator(sessions, node, rec, name=name, reveal_true_wait=True).run().metrics[metric]
        recs.append(rec)
    keys = sorted(recs[0].decisions, key=str)
    if len(recs) ** len(keys) > MAX_ASSIGNMENTS:
        raise ValueError(f"{len(recs)}^{len(keys)} assignments: the trace is too big for the exact search")
    best, best_res = float("inf"), None
    for combo in itertools.product(range(len(recs)), repeat=len(keys)):
        res = Simulator(sessions, node, _Mixed(recs, dict(zip(keys, combo))), name="offline_optimum",
                        reveal_true_wait=True).run()
        v = res.metrics[metric]
        if v < best:
            best, best_res = v, res
    return best, own, best_res


def envelope(metrics: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """Per metric, the best value any policy in ``metrics`` (name -> metrics) reached."""
    out: dict[str, float] = {}
    for k in LOWER_IS_BETTER:
        vals = [m[k] for m in metrics.values() if k in m]
        if vals:
            out[k] = min(vals)
    for k in HIGHER_IS_BETTER:
        vals = [m[k] for m in metrics.values() if k in m]
        if vals:
            out[k] = max(vals)
    return out
