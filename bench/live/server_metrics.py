"""kvtier's counters and the engine's block size, read from a vLLM server's
Prometheus ``/metrics`` text.

kvtier's connector exports its tier's counters there as ``vllm:kvtier_*``
(``engine_adapter/vllm.py``, ``KvtierTier.build_metric_definitions``);
:func:`kvtier_counters` folds them back into the shape of the tier's own
``stats()`` (the part the live benchmark reports), summed over the labels
kvtier does not set (vLLM's ``engine``, ``model_name``).  Pure functions of
the text.
"""
from __future__ import annotations

import re
from typing import Any, Mapping

PREFIX = "vllm:kvtier_"
_SAMPLE = re.compile(r'^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?$')
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')
_BY_LABEL = {"blocks_loaded": ("loaded_by_tier", "tier"), "blocks_stored": ("stored_by_tier", "tier"),
             "decisions": ("decisions", "action")}
_LIFECYCLE = {"demoted_blocks": "demoted_blocks", "staged_blocks": "staged_blocks", "pauses": "pauses",
              "forgotten_sessions": "forgotten"}
_PLAIN = {"load_failures": "load_failures", "contained_errors": "contained_errors",
          "hint_rejections": "hint_rejections", "lookups": "lookups", "lookup_hits": "lookup_hits",
          "skipped_blocks": "chunks_skipped", "read_skips": "read_skips"}


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Every sample line's (name, labels, value); comments and unparseable lines skipped."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line.strip())
        if not m:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        labels = {k: v.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
                  for k, v in _LABEL.findall(m.group(2) or "")}
        out.append((m.group(1), labels, value))
    return out


def kvtier_counters(text: str) -> dict[str, Any] | None:
    """kvtier's counters in its ``stats()`` shape: ``loaded_by_tier``,
    ``stored_by_tier``, ``decisions`` (by action), ``lifecycle``
    (``demoted_blocks``, ``staged_blocks``, ``pauses``, ``forgotten``) and the
    plain counts.  None when the text defines no ``vllm:kvtier_*`` metric (no
    kvtier connector in that server)."""
    if PREFIX not in text:
        return None
    out: dict[str, Any] = {k: {} for k, _ in _BY_LABEL.values()}
    out["lifecycle"] = {k: 0.0 for k in _LIFECYCLE.values()}
    out.update({k: 0.0 for k in _PLAIN.values()})
    for name, labels, value in samples(text):
        if not (name.startswith(PREFIX) and name.endswith("_total")):
            continue
        base = name[len(PREFIX):-len("_total")]
        if base in _BY_LABEL:
            key, label = _BY_LABEL[base]
            lv = labels.get(label, "")
            out[key][lv] = out[key].get(lv, 0.0) + value
        elif base in _LIFECYCLE:
            out["lifecycle"][_LIFECYCLE[base]] += value
        elif base in _PLAIN:
            out[_PLAIN[base]] += value
    return out


def counters_delta(after: Mapping[str, Any], before: Mapping[str, Any] | None) -> dict[str, Any]:
    """``after - before``, key by key (nested mappings too); a key only in
    ``after`` counts from zero."""
    before = before or {}
    out: dict[str, Any] = {}
    for k, v in after.items():
        b = before.get(k)
        if isinstance(v, Mapping):
            out[k] = counters_delta(v, b if isinstance(b, Mapping) else {})
        else:
            out[k] = v - (b if isinstance(b, (int, float)) else 0)
    return out


def block_size(text: str) -> int | None:
    """The engine's KV block size in tokens, from vLLM's ``vllm:cache_config_info``
    (None when absent)."""
    for name, labels, _ in samples(text):
        if name == "vllm:cache_config_info" and labels.get("block_size", "").isdigit():
            return int(labels["block_size"])
    return None
