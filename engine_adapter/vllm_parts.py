"""What a vLLM ``KvtierTier`` runs, built in one place from vLLM's offloading spec and the tier's options.

:func:`build_tier_parts` reads the options (:class:`~kvtier.engine_adapter.config.PluginConfig`),
the chunk layout vLLM's spec describes (namespace, store root, tokens per chunk),
the engine's facts (:mod:`kvtier.engine_adapter.geometry`: the connector's, else
the spec's plus the model's local config; measured on this node when a forecast
prices pauses), and then the plugin's parts (:func:`kvtier.engine_adapter.wiring.build_parts`:
pricing, policy, advisor, store, lifecycle).  The tier only receives them.

Runs on the thread that builds the tier (vLLM's scheduler process, at start);
raises ValueError for a bad option or a non-contiguous primary view, and what
the store's open raises.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from kvtier.engine_adapter.config import PluginConfig, YieldToPrefill, slug
from kvtier.engine_adapter.firewall import Firewall
from kvtier.engine_adapter.geometry import EngineFacts, facts_from_vllm_spec, measure_node
from kvtier.engine_adapter.hints import HintReader
from kvtier.engine_adapter.plugin_common import KeyMemo, store_key
from kvtier.engine_adapter.prefix_trajectories import PrefixTrajectories
from kvtier.engine_adapter.resume_reads import reads_nvme
from kvtier.engine_adapter.switch_interval import lower_switch_interval
from kvtier.engine_adapter.wiring import PluginParts, build_parts
from kvtier.store import Namespace, StoreConfig

log = logging.getLogger("kvtier.vllm")

FACTS_KEY = "kvtier_engine"        # the connector's engine facts, handed to the tier through the spec


def platform_device() -> str:
    """The device vLLM runs its forward pass on ("cuda", "cpu", ...; "cuda" when it does not say)."""
    from vllm.platforms import current_platform
    return str(getattr(current_platform, "device_type", "cuda") or "cuda")


def yields_to_prefill(mode: YieldToPrefill) -> bool:
    """``yield_to_prefill``: ON, OFF, or AUTO: on where vLLM runs its forward
    pass on the CPU (the cores kvtier's threads share)."""
    if mode is not YieldToPrefill.AUTO:
        return mode is YieldToPrefill.ON
    return platform_device() == "cpu"


@dataclass(frozen=True)
class ChunkLayout:
    """What vLLM's offloading spec says about the tier's chunks.

    model_name:        the served model ("model" when the spec does not say).
    namespace:         the store keys' namespace (model, KV dtype, chunk layout, world size).
    root:              the store's folder under ``data_dir`` (one per engine: model, world, DP rank).
    tokens_per_chunk:  tokens in one chunk (0: unknown)."""

    model_name: str
    namespace: Namespace
    root: Path
    tokens_per_chunk: int

    @classmethod
    def of(cls, offloading_spec: Any, data_dir: str) -> "ChunkLayout":
        spec_cfg = getattr(offloading_spec, "config", None)        # vLLM's objects: probed, they vary by version
        model = getattr(spec_cfg, "model", None)
        model_name = getattr(model, "name", None) or "model"
        kv_dtype = str(getattr(model, "dtype", "unknown"))
        par = getattr(spec_cfg, "parallel", None)
        world = int(getattr(par, "world_size", 1) or 1)
        dp = int(getattr(par, "data_parallel_index", 0) or 0)
        tokens = getattr(offloading_spec, "tokens_per_block", ())
        bpc = int(getattr(offloading_spec, "blocks_per_chunk", 1) or 1)
        ns = Namespace(model_id=model_name, dtype=kv_dtype,
                       layout=f"vllm:chunk{bpc}x{','.join(map(str, tokens))}:w{world}", tp_rank=0)
        root = Path(data_dir) / "-".join([slug(model_name), f"w{world}"] + ([f"dp{dp}"] if dp else []))
        return cls(model_name, ns, root, int(tokens[0]) * bpc if tokens else 0)


@dataclass
class TierParts:
    """Everything one tier runs (see the module doc).  ``plugin``'s parts are
    closed by :meth:`PluginParts.close`; the rest hold no resources."""

    cfg: PluginConfig
    layout: ChunkLayout
    rows: np.ndarray | None        # vLLM's primary-tier rows, one chunk per row (a view of its shared
                                   # region; None once the tier shut down)
    store_cfg: StoreConfig
    facts: EngineFacts | None
    plugin: PluginParts
    firewall: Firewall
    hints: HintReader
    prefix: PrefixTrajectories | None
    memo: KeyMemo                  # offload key -> store key under ``layout.namespace``
    yield_to_prefill: bool
    reads_nvme: bool = True        # a lookup answers HIT for a chunk kept only on NVMe (:mod:`.resume_reads`)


def engine_facts(offloading_spec: Any, facts_opt: Any, cfg: PluginConfig, layout: ChunkLayout,
                 store_cfg: StoreConfig) -> EngineFacts | None:
    """The engine's facts: the connector's (``facts_opt``), else the spec's; the
    bytes per token the store holds; measured on this node when a forecast
    prices pauses without a ``node`` preset.  None: unreadable."""
    block_bytes, tpc = store_cfg.block_bytes, layout.tokens_per_chunk
    token_bytes = block_bytes // tpc if tpc else None
    if isinstance(facts_opt, dict):
        facts: EngineFacts | None = EngineFacts.from_dict(facts_opt)
    else:
        facts = facts_from_vllm_spec(getattr(offloading_spec, "config", None), token_bytes=token_bytes,
                                     device=platform_device())
    if facts is not None and token_bytes:
        facts = replace(facts, token_bytes=token_bytes)
    if facts is not None and cfg.node is None and (cfg.policy or cfg.service_url):   # priced as measured here
        cap = store_cfg.nvme_throttle_gbps
        facts = measure_node(facts, layout.root, host_bytes=store_cfg.host_frames * block_bytes,
                             chunk=block_bytes, nvme_cap_bps=cap * 1e9 if cap else None)
    return facts


def build_tier_parts(offloading_spec: Any, primary_kv_view: memoryview, options: dict[str, Any],
                     block_bytes: int) -> TierParts:
    """The tier's parts from vLLM's spec, its primary view and the tier's options
    (``module_path`` and the connector's facts, under :data:`FACTS_KEY`, are
    taken out first).  Raises as the module doc says."""
    options = dict(options)
    options.pop("module_path", None)
    facts_opt = options.pop(FACTS_KEY, None)
    cfg = PluginConfig.parse(options, engine="vllm")
    lower_switch_interval(cfg.switch_interval_ms)
    layout = ChunkLayout.of(offloading_spec, cfg.data_dir)
    if not primary_kv_view.contiguous:
        raise ValueError("kvtier: the primary tier's KV view must be contiguous")
    rows = np.frombuffer(primary_kv_view, dtype=np.uint8).reshape(-1, block_bytes)
    store_cfg = StoreConfig.from_env(layout.root, block_bytes=block_bytes, **cfg.store_options(),
                                     prepare_slots=True)   # first fills overwrite (store/slotprep.py)
    firewall, hints = Firewall(log), HintReader(log)
    prefix = PrefixTrajectories(cap=cfg.max_trajectories) if cfg.prefix_trajectories else None
    facts = engine_facts(offloading_spec, facts_opt, cfg, layout, store_cfg)
    plugin = build_parts(cfg, store_cfg, facts, model_name=layout.model_name)
    ns = layout.namespace
    reads = reads_nvme(plugin.policy, layout.tokens_per_chunk, firewall.contain)
    if not reads:
        log.info("kvtier: a chunk kept only on NVMe is recomputed, not read (the policy prices its read above "
                 "its prefill)")
    return TierParts(cfg, layout, rows, store_cfg, facts, plugin, firewall, hints, prefix,
                     KeyMemo(lambda k, ns=ns: store_key(ns, k)), yields_to_prefill(cfg.yield_to_prefill), reads)
