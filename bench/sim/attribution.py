"""Per-pause attribution: what each pause cost, against what the policy expected when it decided.

Every pause gets a :class:`PauseRecord` from the moment the policy decides
until the trajectory's next pause (or its end).  The simulator adds the
outcome, term by term:

=================  ==========================================================
``hold_gbs``       HBM GB-seconds held while paused (copy-outs in flight,
                   retained state, a prefetch that landed early)
``transfer_s``     service time of its transfers (link and NVMe)
``link_queue_s``   time its transfers waited behind others on the host link
``nvme_queue_s``   ... on the NVMe read/write servers
``stall_s``        tool return -> state resident again (its resume stall,
                   without the rebuild)
``recompute_s``    prefill time of context rebuilt because it was dropped
=================  ==========================================================

The expectation is what the policy put into ``Decision.extra`` under the same
names with an ``exp_`` prefix (:mod:`kvtier.tiering.policy.breakeven` does; baselines
expect nothing, so their rows show outcomes only).  One owner (the simulator),
not thread-safe.
"""
from __future__ import annotations

from typing import Mapping

TERMS = ("hold_gbs", "transfer_s", "link_queue_s", "nvme_queue_s", "stall_s", "recompute_s")
_EXP_KEYS = tuple("exp_" + t for t in TERMS)


class PauseRecord:
    """Outcome of one pause so far, and the policy's expectation (plain data)."""

    __slots__ = ("action", "expected") + TERMS

    def __init__(self, action: str, extra: Mapping[str, float] | None) -> None:
        self.action = action
        self.expected = None
        if extra and "exp_stall_s" in extra:
            self.expected = tuple(float(extra.get(k, 0.0)) for k in _EXP_KEYS)
        self.hold_gbs = self.transfer_s = self.link_queue_s = self.nvme_queue_s = 0.0
        self.stall_s = self.recompute_s = 0.0


class Attribution:
    """Sums of closed records per initial action (see the module docstring)."""

    def __init__(self) -> None:
        # action -> [pauses, outcome sums (6), expected sums (6), pauses with an expectation]
        self.rows: dict[str, list] = {}

    def close(self, rec: PauseRecord) -> None:
        row = self.rows.get(rec.action)
        if row is None:
            row = self.rows[rec.action] = [0, [0.0] * 6, [0.0] * 6, 0]
        row[0] += 1
        out = row[1]
        out[0] += rec.hold_gbs
        out[1] += rec.transfer_s
        out[2] += rec.link_queue_s
        out[3] += rec.nvme_queue_s
        out[4] += rec.stall_s
        out[5] += rec.recompute_s
        if rec.expected is not None:
            row[3] += 1
            exp = row[2]
            for i, v in enumerate(rec.expected):
                exp[i] += v

    def merge(self, other: "Attribution") -> None:
        """Add ``other``'s sums (a cluster merging its nodes)."""
        for a, (n, out, exp, ne) in other.rows.items():
            row = self.rows.setdefault(a, [0, [0.0] * 6, [0.0] * 6, 0])
            row[0] += n
            row[3] += ne
            for i in range(6):
                row[1][i] += out[i]
                row[2][i] += exp[i]

    def summary(self) -> dict:
        """Per action and in total: pauses, mean outcome per pause, mean expectation per pause
        (None where the policy gave none).  JSON-ready."""
        out: dict = {}
        tot = [0, [0.0] * 6, [0.0] * 6, 0]
        for a in sorted(self.rows):
            n, o, e, ne = self.rows[a]
            out[a] = _row(n, o, e, ne)
            tot[0] += n
            tot[3] += ne
            for i in range(6):
                tot[1][i] += o[i]
                tot[2][i] += e[i]
        out["all"] = _row(*tot)
        return out


def _row(n: int, o: list, e: list, ne: int) -> dict:
    return {"pauses": n,
            "outcome": {t: (o[i] / n if n else 0.0) for i, t in enumerate(TERMS)},
            "expected": ({t: e[i] / ne for i, t in enumerate(TERMS)} if ne else None)}
