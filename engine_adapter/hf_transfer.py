"""The transformers hook's data path: a paused cache leaves the device (offload
through the movers into the store, or drop) and comes back (store -> frames ->
device in layer groups, or recompute by prefill).

:class:`DeviceTransfers` owns the staging frames and the movers; an offload is
written by one of two :class:`Offloader` classes, picked per tier once from
the :class:`OffloadPath`::

    TwoPhaseOffload   device -> the store's own buffers (prepare_store /
                      complete_store): one copy
    StagedOffload     device -> staging frames -> store (put_many)

Policy never reaches here: these methods carry out an action they are given.
Threads: ``leave_device`` runs on the session's caller thread or a lease
step's (under the trajectory's lock); ``start_reload`` on the lifecycle's
timer thread (an ``Event.RELOAD``) or the resume, once per ``Reload`` (its
``started`` event is set under the job lock).  The movers run their own
``kvtier-*`` threads.
"""
from __future__ import annotations

import enum
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

import torch

from kvtier.dma.layouts import FrameFormat, HFLayout
from kvtier.dma.movers import (DeviceToHostMover, DeviceToStoreMover, HostToDeviceMover, HostToStoreMover,
                               StoreToHostMover)
from kvtier.dma.spec import DeviceBlocks, HostFrames, StoreBlocks, TransferSpec
from kvtier.dma.staging import FramePool, FramePoolFull
from kvtier.tiering.model.decision import Action
from kvtier.tiering.model.tiers import Tier

from kvtier.engine_adapter.hf_cache import CACHE_KW as _CACHE_KW
from kvtier.engine_adapter.hf_trajectory import OFFLOADS, HFTrajectory, Reload


class OffloadPath(str, enum.Enum):
    """How an offload reaches the store.  ``AUTO`` takes the one measured faster per
    tier (``python -m kvtier.bench.bench_offload``): two-phase for the host tier
    (1.3-2.0x), staged for NVMe (two-phase's fresh NVMe staging memory made it 0.4-0.7x)."""

    AUTO = "auto"
    TWO_PHASE = "two_phase"
    STAGED = "staged"

    def __str__(self) -> str:
        return self.value

    def for_tier(self, tier: Tier) -> "OffloadPath":
        if self is not OffloadPath.AUTO:
            return self
        return OffloadPath.TWO_PHASE if tier is Tier.HOST else OffloadPath.STAGED


class OffloadFailed(Exception):
    """An offload wrote nothing usable (the store or the staging pool is full, a mover failed)."""


@dataclass(frozen=True)
class Departure:
    """What :meth:`DeviceTransfers.leave_device` did."""

    action: Action                 # what was done (RECOMPUTE when an offload failed)
    fallback: str                  # why the offload fell back to recompute ("": it did not)
    bytes_moved: int
    blocks_moved: int
    seconds: float                 # wall time of D2H + store writes


class Offloader(Protocol):
    """Writes blocks of a device layout into the store; raises OffloadFailed."""

    def write(self, name: str, layout: HFLayout, blocks: list[int], keys: list[bytes], tier: Tier) -> int:
        """Writes ``layout``'s ``blocks`` under ``keys`` into ``tier``; returns the bytes written."""
        ...


class TwoPhaseOffload:
    """Device -> the store's own buffers, one copy (``DeviceToStoreMover``)."""

    def __init__(self, d2s: DeviceToStoreMover, job: Callable[[], int]) -> None:
        self.d2s, self._job = d2s, job

    def write(self, name: str, layout: HFLayout, blocks: list[int], keys: list[bytes], tier: Tier) -> int:
        try:
            self.d2s.register_layout(name, layout)
            r = self.d2s.transfer_async(self._job(), TransferSpec(DeviceBlocks(name, blocks),
                                                                  StoreBlocks(keys, tier=tier))).result()
            if not r.ok:
                raise OffloadFailed(r.error)
            return r.nbytes
        finally:
            self.d2s.unregister_layout(name)


class StagedOffload:
    """Device -> staging frames -> store (``DeviceToHostMover`` then ``HostToStoreMover``)."""

    def __init__(self, pool: FramePool, d2h: DeviceToHostMover, to_store: HostToStoreMover,
                 job: Callable[[], int]) -> None:
        self.pool, self.d2h, self.to_store, self._job = pool, d2h, to_store, job

    def write(self, name: str, layout: HFLayout, blocks: list[int], keys: list[bytes], tier: Tier) -> int:
        try:
            frames = self.pool.alloc(len(blocks))
        except FramePoolFull as exc:
            raise OffloadFailed(str(exc)) from None
        try:
            self.d2h.register_layout(name, layout)
            r = self.d2h.transfer_async(self._job(), TransferSpec(DeviceBlocks(name, blocks), HostFrames(frames))).result()
            if not r.ok:
                raise OffloadFailed(r.error)
            r = self.to_store.transfer_async(self._job(), TransferSpec(HostFrames(frames),
                                                                       StoreBlocks(keys, tier=tier))).result()
            if not r.ok:
                raise OffloadFailed(r.error)
            return r.nbytes
        finally:
            self.d2h.unregister_layout(name)
            self.pool.free(frames)


class DeviceTransfers:
    """Offload, reload and recompute of one model's trajectory caches (see the module doc).

    ``store``: the session's store; ``fmt``: the model's frame; ``staging_frames``:
    frames of the staging pool; ``layer_groups``: how many groups a reload streams in.
    ``close()`` stops the movers (idempotent)."""

    def __init__(self, model: Any, fmt: FrameFormat, store: Any, *, device: Any, layer_groups: int,
                 staging_frames: int, offload_path: OffloadPath) -> None:
        self.model, self.fmt, self.device, self.layer_groups = model, fmt, device, int(layer_groups)
        self._jobs = iter(range(1, 1 << 62))
        self._job_lock = threading.Lock()
        self.pool = FramePool(fmt, staging_frames)
        self.d2h, self.h2d = DeviceToHostMover(self.pool), HostToDeviceMover(self.pool)
        self.to_store, self.from_store = HostToStoreMover(self.pool, store), StoreToHostMover(self.pool, store)
        self.d2s = DeviceToStoreMover(self.pool, store)
        by_path = {OffloadPath.TWO_PHASE: TwoPhaseOffload(self.d2s, self._job),
                   OffloadPath.STAGED: StagedOffload(self.pool, self.d2h, self.to_store, self._job)}
        self._offloaders: dict[Tier, Offloader] = {t: by_path[offload_path.for_tier(t)] for t in (Tier.HOST, Tier.NVME)}

    def _job(self) -> int:
        with self._job_lock:
            return next(self._jobs)

    # -- out -----------------------------------------------------------------
    def leave_device(self, tr: HFTrajectory, action: Action, stored: Sequence[bool]) -> Departure:
        """Carry out ``action`` for ``tr``'s device cache (``stored``: per key of ``tr.keys``,
        whether the store holds it already): offload the rest (falls back to recompute when
        the store or the staging pool is full) and/or free the cache.  Caller holds ``tr.lock``."""
        moved = blocks = 0
        seconds, fallback = 0.0, ""
        if action in OFFLOADS:
            t0 = time.perf_counter()
            try:
                moved, blocks = self._offload(tr, stored, action.tier)
            except OffloadFailed as exc:
                action, fallback = Action.RECOMPUTE, f"fallback: {exc}"
            seconds = time.perf_counter() - t0
        if action != Action.RETAIN:
            tr.cache = None                       # the device tensors are released here
        return Departure(action, fallback, moved, blocks, seconds)

    def _offload(self, tr: HFTrajectory, stored: Sequence[bool], tier: Tier) -> tuple[int, int]:
        """Write the blocks the store lacks into ``tier``; returns (bytes, blocks).  Raises OffloadFailed."""
        todo = [i for i, s in enumerate(stored) if not s]
        if not todo:
            return 0, 0
        layout = HFLayout([l.keys for l in tr.cache.layers], [l.values for l in tr.cache.layers], self.fmt)
        nbytes = self._offloaders[tier].write(f"offload:{tr.tid}", layout, todo, [tr.keys[i] for i in todo], tier)
        return nbytes, len(todo)

    # -- back ----------------------------------------------------------------
    def claim_reload(self, rl: Reload) -> bool:
        """Stop a reload that has not started (True); False if it already started."""
        with self._job_lock:
            if rl.started.is_set():
                return False
            rl.started.set()
        return True

    def start_reload(self, rl: Reload) -> None:
        """Store -> frames -> device (layer groups).  Idempotent; resolves ``rl.ready``
        (None: a block missing or corrupt, or the reload failed)."""
        if not self.claim_reload(rl):
            return
        frames: tuple[int, ...] = ()
        try:
            frames = self.pool.alloc(len(rl.keys))
            r = self.from_store.transfer_async(self._job(), TransferSpec(StoreBlocks(rl.keys), HostFrames(frames))).result()
            if not r.ok:
                rl.missing = r.missing or rl.keys
                self.pool.free(frames)
                rl.ready.set_result(None)
                return
            rl.bytes_loaded = r.nbytes
            layout = HFLayout.allocate(self.fmt, rl.seq_len, device=self.device)
            name = f"reload:{id(rl)}"
            self.h2d.register_layout(name, layout)
            comp = self.h2d.transfer_async(
                self._job(), TransferSpec(HostFrames(frames), DeviceBlocks(name, range(len(rl.keys))),
                                          layer_groups=self.layer_groups))

            def _done(_res, name=name, frames=frames):
                self.h2d.unregister_layout(name)
                self.pool.free(frames)

            comp.add_done_callback(_done)
            rl.ready.set_result((layout, comp))
        except Exception:  # a failed reload is a miss: resume recomputes
            if frames and not rl.ready.done():
                self.pool.free(frames)
            rl.missing = rl.keys
            if not rl.ready.done():
                rl.ready.set_result(None)

    def restored_cache(self, layout: HFLayout, comp) -> tuple[Any, list[float]]:
        """A DynamicCache over the reloaded tensors whose layer l waits for its group on first use,
        and the list its waits are appended to."""
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer

        groups = self.fmt.layer_groups(self.layer_groups)
        group_of = {l: g for g, lr in enumerate(groups) for l in lr}
        waits: list[float] = []

        class _ReloadingLayer(DynamicLayer):
            def __init__(self, k, v, g):
                super().__init__()
                self.keys, self.values, self.device, self.is_initialized = k, v, k.device, True
                self._group = g

            def update(self, key_states, value_states, *args, **kwargs):
                if self._group is not None:
                    if not comp.group_done(self._group):
                        t0 = time.perf_counter()
                        comp.wait_group(self._group)
                        waits.append(time.perf_counter() - t0)
                    else:
                        comp.wait_group(self._group)
                    self._group = None
                return super().update(key_states, value_states, *args, **kwargs)

        cache = DynamicCache(config=self.model.config)
        cache.layers = [_ReloadingLayer(layout.keys[l], layout.values[l], group_of[l]) for l in range(self.fmt.layers)]
        return cache, waits

    def recompute(self, tokens: Sequence[int]) -> Any:
        """A new cache holding ``tokens`` (one prefill)."""
        from transformers import DynamicCache
        cache = DynamicCache(config=self.model.config)
        if tokens:
            with torch.no_grad():
                self.model(input_ids=torch.tensor([list(tokens)], device=self.device), **{_CACHE_KW: cache},
                           use_cache=True)
        return cache

    def close(self) -> None:
        """Stop the movers (idempotent)."""
        for m in (self.d2h, self.h2d, self.to_store, self.from_store, self.d2s):
            m.close()
