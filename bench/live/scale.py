"""A scale model of a GPU node on vLLM's CPU engine (``kvtier bench live --scale-to NODE``).

On vLLM's CPU platform the "device" is host memory: a reload costs a memory
copy and no placement can differ much.  The scale model slows every move and
stretches every wait so that their ratios to a prefill are the target's:

    f = our prefill s per 1k tokens / the target's          (wall seconds per target second)

    quantity (a context of S tokens)   target (presets)            ours (wall)
    prefill                            2 P S / prefill_flops       measured here
    link (reload over PCIe)            kv_bytes(S) / link_h2d      f x target: link_gbps = our bytes / that
    NVMe read                          kv_bytes(S) / nvme_read     f x target: nvme_throttle_gbps likewise
    tool wait, break-even wait         target seconds              x f (the workload's waits, kvtier's clock)

The target's figures are the cost model's (:mod:`kvtier.tiering.model.costmodel`:
``t_recompute``, ``t_reload``, ``t_nvme_read``, ``breakeven_wait``) for a model
and a node preset; ours are measured (:func:`calibrate`: prefill-only requests
of the workload's paused contexts on a throwaway engine, and the engine's KV
bytes per token from its cache allocation).  kvtier's configurations price
pauses as the target (``model``/``node``) on target seconds (``time_scale`` f).
Everything here but :func:`calibrate` is pure.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Sequence

from kvtier.tiering.model.costmodel import breakeven_wait, t_nvme_read, t_recompute, t_reload
from kvtier.tiering.model.presets import get_node, get_preset

GB = 1e9


@dataclass(frozen=True)
class Target:
    """What ``--scale-to NAME`` models: a model preset on a node preset."""
    name: str
    model: str
    node: str
    about: str


TARGETS = {t.name: t for t in (
    Target("h100x8", "llama-3.1-70b", "h100x8",
           "the seed's 70B on the 8 x H100 node: one PCIe Gen5 link of 64 GB/s per GPU, NVMe 7 GB/s"),
    Target("pcie4", "llama-3.1-70b", "pcie4",
           "the 70B on one accelerator behind a PCIe Gen4 x16 link (25 GB/s), NVMe 3.5 GB/s"),
)}


def target(name: str) -> Target:
    """The scale-model target called ``name``.  Raises ValueError naming the known ones."""
    if name not in TARGETS:
        raise ValueError(f"unknown scale-model target {name!r}; known: {', '.join(TARGETS)}")
    return TARGETS[name]


@dataclass(frozen=True)
class Calibration:
    """This engine, measured: prefill seconds per 1k computed tokens (the median
    over ``samples``: (computed tokens, TTFT s)) and KV bytes per token."""
    prefill_s_per_1k: float
    kv_bytes_per_token: float
    samples: tuple[tuple[int, float], ...] = ()

    def __post_init__(self) -> None:
        for k in ("prefill_s_per_1k", "kv_bytes_per_token"):
            v = getattr(self, k)
            if not (v > 0 and math.isfinite(v)):
                raise ValueError(f"calibration: {k} must be a positive number, got {v!r}")


@dataclass(frozen=True)
class ScaleModel:
    """The settings of one scale-model run (module doc).  ``context_tokens``:
    the context the per-context rows are given at (the workload's mean paused context)."""
    target: Target
    ours: Calibration
    context_tokens: int
    f: float                    # wall seconds per target second
    link_gbps: float            # the CPU worker's link (link_gbps)
    nvme_gbps: float            # kvtier's NVMe tier (nvme_throttle_gbps)
    target_prefill_s_per_1k: float
    target_kv_bytes_per_token: float
    target_prefill_s: float     # per context
    target_link_s: float
    target_nvme_s: float
    target_breakeven_s: float

    @property
    def label(self) -> str:
        return f"scale model of {self.target.name}"

    def kvtier_options(self) -> dict:
        """The kvtier options every kvtier configuration of the run gets."""
        return {"model": self.target.model, "node": self.target.node, "time_scale": self.f,
                "link_gbps": self.link_gbps, "nvme_throttle_gbps": self.nvme_gbps}

    def rows(self, prefill_s_per_1k: float | None = None) -> list[dict]:
        """Per quantity: the target's seconds, ours (wall seconds: measured or set),
        and each as a ratio to its own prefill of the same context.  Our prefill is
        ``prefill_s_per_1k`` where given (measured in the runs), else the calibration's."""
        ours_pf = (prefill_s_per_1k or self.ours.prefill_s_per_1k) * self.context_tokens / 1000
        rows = [("prefill", self.target_prefill_s, ours_pf, "measured"),
                ("link (one way)", self.target_link_s, self.f * self.target_link_s, f"set: {self.link_gbps:.3g} GB/s"),
                ("NVMe read", self.target_nvme_s, self.f * self.target_nvme_s, f"set: {self.nvme_gbps:.3g} GB/s"),
                ("break-even wait", self.target_breakeven_s, self.f * self.target_breakeven_s,
                 f"set: waits x {self.f:.3g}")]
        return [{"quantity": q, "target_s": t, "ours_s": o, "how": how,
                 "target_ratio": t / self.target_prefill_s, "ours_ratio": o / ours_pf} for q, t, o, how in rows]

    def as_dict(self, *, run_prefill_s_per_1k: float | None = None) -> dict:
        """The JSON document's ``scale_model``: settings, the calibration, and
        the rows at calibration (``rows``) and as the runs measured the prefill
        (``achieved``, when given)."""
        return {"label": self.label, "target": self.target.name, "model": self.target.model,
                "node": self.target.node, "about": self.target.about, "time_scale": self.f,
                "link_gbps": self.link_gbps, "nvme_throttle_gbps": self.nvme_gbps,
                "context_tokens": self.context_tokens,
                "ours": {"prefill_ms_per_1k_tokens": self.ours.prefill_s_per_1k * 1000,
                         "kv_bytes_per_token": self.ours.kv_bytes_per_token,
                         "samples": [list(s) for s in self.ours.samples]},
                "target_prefill_ms_per_1k_tokens": self.target_prefill_s_per_1k * 1000,
                "target_kv_bytes_per_token": self.target_kv_bytes_per_token,
                "rows": self.rows(),
                **({"achieved": self.rows(run_prefill_s_per_1k)} if run_prefill_s_per_1k else {})}


def scale_model(name: str, ours: Calibration, *, context_tokens: int) -> ScaleModel:
    """The scale model of target ``name`` for an engine calibrated as ``ours``
    (pure).  Raises ValueError for an unknown target or a context < 1 token."""
    t = target(name)
    if context_tokens < 1:
        raise ValueError(f"context_tokens must be >= 1, got {context_tokens}")
    geo, hw = get_preset(t.model), get_node(t.node)
    pf_1k = t_recompute(geo, 1000, hw)
    f = ours.prefill_s_per_1k / pf_1k
    nbytes = geo.kv_bytes(context_tokens)
    link_s, nvme_s = t_reload(nbytes, hw), t_nvme_read(nbytes, hw)
    ours_bytes = ours.kv_bytes_per_token * context_tokens
    return ScaleModel(target=t, ours=ours, context_tokens=int(context_tokens), f=f,
                      link_gbps=ours_bytes / (f * link_s) / GB, nvme_gbps=ours_bytes / (f * nvme_s) / GB,
                      target_prefill_s_per_1k=pf_1k, target_kv_bytes_per_token=geo.token_bytes,
                      target_prefill_s=t_recompute(geo, context_tokens, hw), target_link_s=link_s,
                      target_nvme_s=nvme_s, target_breakeven_s=breakeven_wait(nbytes, hw))


def calibration_contexts(paused: Sequence[int]) -> list[int]:
    """The contexts to calibrate at: the smallest, median and largest of the
    workload's paused contexts (distinct, in order).  Raises ValueError for none."""
    xs = sorted(int(x) for x in paused if x > 0)
    if not xs:
        raise ValueError("no paused context to calibrate at")
    return sorted({xs[0], xs[len(xs) // 2], xs[-1]})


def calibrate(spec, contexts: Sequence[int], *, vocab: int, seed: int = 0, repeats: int = 2) -> Calibration:
    """Measure the engine of ``spec`` (an :class:`~kvtier.engine_adapter.vllm_inprocess.EngineSpec`
    without a connector, started here and closed): after one warm-up request, ``repeats``
    prefill-only requests (one output token, token ids no earlier request shared) of each
    context; the prefill rate is the median TTFT per 1k computed tokens.  KV bytes per token
    are the engine's KV cache allocation over its token slots.  Raises VllmMissing."""
    from kvtier.bench.live.workload import token_ids
    from kvtier.engine_adapter.vllm_inprocess import LiveEngine
    samples: list[tuple[int, float]] = []
    with LiveEngine(spec) as eng:
        eng.generate(token_ids(seed, "calibrate-warmup", 0, max(contexts), vocab), max_tokens=1)
        for r in range(repeats):
            for n in contexts:
                res = eng.generate(token_ids(seed, f"calibrate-{r}", n, n, vocab), max_tokens=1)
                computed = res.prompt_tokens - res.cached_tokens
                if computed > 0:
                    samples.append((computed, res.ttft_s))
        per_token = kv_bytes_per_token(eng)
    if not samples:
        raise ValueError("calibration: no request computed any token")
    rate = statistics.median(ttft / n * 1000 for n, ttft in samples)
    return Calibration(prefill_s_per_1k=rate, kv_bytes_per_token=per_token, samples=tuple(samples))


def kv_bytes_per_token(eng) -> float:
    """An in-process engine's KV bytes per token: every KV-cache group's page
    over its block's tokens, times its layers (vLLM's ``kv_cache_config``)."""
    groups = eng.scheduler().kv_cache_config.kv_cache_groups
    return float(sum(g.kv_cache_spec.page_size_bytes * len(g.layer_names) / g.kv_cache_spec.block_size
                     for g in groups))
