"""Why a turn's prompt does not extend its predecessor: the breakers of the reference text.

Checked in this order on the previous and the current request (the first that
explains the difference wins):

``none``          the rendered prompt extends the previous one (or the first turn);
``tools_changed`` the tool definitions differ as a set (added, removed, edited), unless
                  the difference is volatile content (then ``head_volatile``);
``reordered``     same content, different order: the tools as a set are equal but listed
                  in another order, or every object equals its predecessor once keys are
                  sorted (JSON key order, ``tool_calls`` argument strings included);
``head_volatile`` every value that differs, in the tool definitions or in the previous
                  request's messages, is volatile content (:mod:`.volatile`: dates, clock
                  times, weekdays, UUIDs, request ids, epoch numbers, hex ids, nonces): a
                  per-call field, named on its first change; the result lists each value
                  (:class:`.volatile.VolatileChange`).  A volatile change beside a real edit
                  is not this cause;
``compaction``    earlier messages were removed or summarized: some of the old messages
                  after the first differing one are gone from the new request (two or more,
                  or one replaced by a message of another role);
``edit``          anything else: an earlier message really changed in place.

For token-only log lines (no request) :func:`classify_text` reads the two prompts decoded
by the doctor's tokenizer: ``none``, ``head_volatile`` (field ``tokens``, characters of the
decoded prompt) or ``edit``; a prompt that cannot be decoded is an ``edit``.
Pure functions.
"""
from __future__ import annotations

import json
from typing import Mapping, NamedTuple

from kvtier.tiering.prefix.volatile import VolatileChange, changes, mask

CAUSES = ("none", "head_volatile", "tools_changed", "reordered", "compaction", "edit")
MAX_CHANGES = 16


class Cause(NamedTuple):
    """A break's cause (one of :data:`CAUSES`) and, for ``head_volatile``, the values that
    changed (at most :data:`MAX_CHANGES`, in prompt order)."""

    name: str
    volatile: tuple[VolatileChange, ...] = ()


NONE = Cause("none")
EDIT = Cause("edit")


def _sorted_obj(o):
    """``o`` with every dict's keys sorted, and JSON argument strings parsed."""
    if isinstance(o, Mapping):
        return {k: _sorted_obj(o[k]) for k in sorted(o)}
    if isinstance(o, list):
        return [_sorted_obj(x) for x in o]
    if isinstance(o, str) and o[:1] in "{[":
        try:
            return _sorted_obj(json.loads(o))
        except ValueError:
            return o
    return o


def _canon(o) -> str:
    return json.dumps(_sorted_obj(o), ensure_ascii=False, sort_keys=True)


def _is_prefix(a: list, b: list) -> bool:
    return len(a) <= len(b) and b[:len(a)] == a


def _leaf_changes(a, b, path: str) -> list[VolatileChange] | None:
    """The volatile changes from ``a`` to ``b`` (sorted objects of the same shape), or None
    when something else differs."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        if set(a) != set(b):
            return None
        out: list[VolatileChange] = []
        for k in a:
            sub = _leaf_changes(a[k], b[k], f"{path}.{k}")
            if sub is None:
                return None
            out.extend(sub)
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return None
        out = []
        for i, (x, y) in enumerate(zip(a, b)):
            sub = _leaf_changes(x, y, f"{path}[{i}]")
            if sub is None:
                return None
            out.extend(sub)
        return out
    if a == b and type(a) is type(b):
        return []
    scalar = (str, int, float)
    if isinstance(a, scalar) and isinstance(b, scalar) and not isinstance(a, bool) and not isinstance(b, bool):
        return changes(str(a), str(b), path)
    return None


def _volatile_head(pt: list, ct: list, pm: list, cm: list) -> tuple[VolatileChange, ...]:
    """Every change from the previous request (tools ``pt``, messages ``pm``) to the current one
    when all of them are volatile and the current messages go on from the previous ones; else ()."""
    if len(pt) != len(ct) or len(cm) < len(pm):
        return ()
    out: list[VolatileChange] = []
    msgs = [(m, n, f"messages[{i}]") for i, (m, n) in enumerate(zip(pm, cm))]
    head = 0                                     # leading system messages come before the tools
    while head < len(msgs) and isinstance(pm[head], Mapping) and pm[head].get("role") in ("system", "developer"):
        head += 1
    pairs = msgs[:head] + [(t, u, f"tools[{j}]") for j, (t, u) in enumerate(zip(pt, ct))] + msgs[head:]
    for a, b, path in pairs:
        sub = _leaf_changes(_sorted_obj(a), _sorted_obj(b), path)
        if sub is None:
            return ()
        out.extend(sub)
    return tuple(out[:MAX_CHANGES])


def classify(prev: Mapping | None, cur: Mapping | None, extends: bool) -> Cause:
    """The cause of a break between two requests (module docstring).  ``extends``: the
    current rendered prompt starts with the whole previous one."""
    if extends:
        return NONE
    if prev is None or cur is None:
        return EDIT
    pt, ct = list(prev.get("tools") or []), list(cur.get("tools") or [])
    pm, cm = list(prev.get("messages") or []), list(cur.get("messages") or [])
    pt_c, ct_c = [_canon(t) for t in pt], [_canon(t) for t in ct]
    if sorted(pt_c) != sorted(ct_c):
        vol = _volatile_head(pt, ct, pm, cm)
        return Cause("head_volatile", vol) if vol else Cause("tools_changed")
    pm_c, cm_c = [_canon(m) for m in pm], [_canon(m) for m in cm]
    if pt_c != ct_c and _is_prefix(pm_c, cm_c):
        return Cause("reordered")                # the tools' element order
    if pt_c == ct_c and _is_prefix(pm_c, cm_c):
        return Cause("reordered")                # key order somewhere
    vol = _volatile_head(pt, ct, pm, cm)
    if vol:
        return Cause("head_volatile", vol)
    pk, ck = [mask(x) for x in pm_c], [mask(x) for x in cm_c]
    k = 0
    while k < min(len(pk), len(ck)) and pk[k] == ck[k]:
        k += 1
    gone = [x for x in pk[k:] if x not in ck]
    in_place = (k < len(pk) and k < len(ck) and pk[k + 1:] == ck[k + 1:len(pk)]
                and pm[k].get("role") == cm[k].get("role"))
    if in_place or not gone:
        return EDIT
    return Cause("compaction")


def classify_text(prev: str | None, cur: str | None, extends: bool) -> Cause:
    """The cause of a break between two decoded prompts (None: could not be decoded):
    ``none``, ``head_volatile`` or ``edit``."""
    if extends:
        return NONE
    if prev is None or cur is None:
        return EDIT
    vol = changes(prev, cur, "tokens", prefix=True)
    return Cause("head_volatile", tuple(vol[:MAX_CHANGES])) if vol else EDIT
