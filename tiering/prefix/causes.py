"""Why a turn's prompt does not extend its predecessor: the breakers of the reference text.

Checked in this order on the previous and the current request (the first that
explains the difference wins):

``none``          the rendered prompt extends the previous one (or the first turn);
``tools_changed`` the tool definitions differ as a set (added, removed, edited);
``reordered``     same content, different order: the tools as a set are equal but listed
                  in another order, or every object equals its predecessor once keys are
                  sorted (JSON key order, ``tool_calls`` argument strings included);
``head_volatile`` equal once volatile values are masked (ISO dates and times, clock times,
                  UUIDs, long hex ids, epoch-like numbers): a per-call field;
``compaction``    earlier messages were removed or summarized: some of the old messages
                  after the first differing one are gone from the new request (two or more,
                  or one replaced by a message of another role);
``edit``          anything else: an earlier message really changed in place.

For token-only log lines (no request), only ``none`` and ``edit`` can be told apart.
Pure functions.
"""
from __future__ import annotations

import json
import re
from typing import Mapping

CAUSES = ("none", "head_volatile", "tools_changed", "reordered", "compaction", "edit")

_VOLATILE = re.compile("|".join([
    r"\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?",   # ISO date/time
    r"\b\d{1,2}:\d{2}(?::\d{2})?\b",                                                        # clock time
    r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b",     # UUID
    r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{12,}\b",                                  # hex ids
    r"\b(?:req|call|chatcmpl|msg|run|trace)[-_][A-Za-z0-9]{6,}\b",                          # prefixed ids
    r"\b\d{9,}\b",                                                                          # epoch-like
    r"\b(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)[a-z]*,? ",                                          # weekdays
]))


def mask(text: str) -> str:
    return _VOLATILE.sub("\x00", text)


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


def classify(prev: Mapping | None, cur: Mapping | None, extends: bool) -> str:
    """The cause of a break between two requests (module docstring).  ``extends``: the
    current rendered prompt starts with the whole previous one."""
    if extends:
        return "none"
    if prev is None or cur is None:
        return "edit"
    pt, ct = list(prev.get("tools") or []), list(cur.get("tools") or [])
    pm, cm = list(prev.get("messages") or []), list(cur.get("messages") or [])
    pt_c, ct_c = [_canon(t) for t in pt], [_canon(t) for t in ct]
    if sorted(pt_c) != sorted(ct_c):
        return "tools_changed"
    pm_c, cm_c = [_canon(m) for m in pm], [_canon(m) for m in cm]
    if pt_c != ct_c and _is_prefix(pm_c, cm_c):
        return "reordered"                       # the tools' element order
    if pt_c == ct_c and _is_prefix(pm_c, cm_c):
        return "reordered"                       # key order somewhere
    if _is_prefix([mask(x) for x in pm_c], [mask(x) for x in cm_c]):
        return "head_volatile"
    pk, ck = [mask(x) for x in pm_c], [mask(x) for x in cm_c]
    k = 0
    while k < min(len(pk), len(ck)) and pk[k] == ck[k]:
        k += 1
    gone = [x for x in pk[k:] if x not in ck]
    in_place = (k < len(pk) and k < len(ck) and pk[k + 1:] == ck[k + 1:len(pk)]
                and pm[k].get("role") == cm[k].get("role"))
    if in_place or not gone:
        return "edit"
    return "compaction"
