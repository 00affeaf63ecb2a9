"""The transformers hook's data path: a paused cache leaves the device (offload
through the movers into the store, or drop) and comes back (store -> frames ->
device in layer groups, or recompute by prefill).

:class:`DeviceTransfers` is a mixin of :class:`kvtier.engine_adapter.hf.AgentSession`:
it uses the session's ``model``, ``fmt``, ``device``, ``pool``, movers
(``d2h``, ``h2d``, ``to_store``, ``from_store``, ``d2s``), ``offload_path``,
``layer_groups`` and ``_job``.  Policy never reaches here: these methods carry
out an action they are given.  Threads: ``_offload`` runs on the caller's
thread or a lease step's (under the trajectory's lock); ``_start_reload`` on the
lifecycle timer thread (an ``Event.RELOAD``) or the resume, once per ``Reload``
(guarded by the session's job lock).
"""
from __future__ import annotations

import time
from typing import Any

import torch

from kvtier.dma.layouts import HFLayout
from kvtier.dma.spec import DeviceBlocks, HostFrames, StoreBlocks, TransferSpec
from kvtier.dma.staging import FramePoolFull
from kvtier.tiering.model.decision import Action

from kvtier.engine_adapter.hf_cache import CACHE_KW as _CACHE_KW
from kvtier.engine_adapter.hf_lifecycle import Reload

OFFLOAD_PATHS = ("auto", "two_phase", "staged")


class _OffloadFailed(Exception):
    pass


class DeviceTransfers:
    """Offload, reload and recompute of one trajectory's cache (see the module doc)."""

    def _leave_device(self, tr: Any, action: Action, reason: str, keys, stored):
        """Carry out ``action`` for the device cache: offload (falls back to recompute when the
        store or the staging pool is full) and/or free it.  Returns (action, reason, bytes, blocks, seconds)."""
        moved = blocks_moved = 0
        offload_s = 0.0
        if action in (Action.OFFLOAD_HOST, Action.OFFLOAD_NVME):
            t0 = time.perf_counter()
            try:
                moved, blocks_moved = self._offload(tr, keys, stored, "nvme" if action == Action.OFFLOAD_NVME else "host")
            except _OffloadFailed as exc:
                action, reason = Action.RECOMPUTE, f"fallback: {exc}"
            offload_s = time.perf_counter() - t0
        if action != Action.RETAIN:
            tr.cache = None                       # the device tensors are released here
        return action, reason, moved, blocks_moved, offload_s

    def _claim_reload(self, rl: Reload) -> bool:
        """Stop a reload that has not started (True); False if it already started."""
        with self._job_lock:
            if rl.started.is_set():
                return False
            rl.started.set()
        return True

    def _offload(self, tr: Any, keys, stored, tier: str) -> tuple[int, int]:
        """Move the blocks the store lacks into ``tier`` (two-phase or staged, see ``offload_path``);
        returns (bytes, blocks).  Raises _OffloadFailed."""
        todo = [i for i, s in enumerate(stored) if not s]
        if not todo:
            return 0, 0
        layout = HFLayout([l.keys for l in tr.cache.layers], [l.values for l in tr.cache.layers], self.fmt)
        name = f"offload:{tr.tid}"
        path = self.offload_path if self.offload_path != "auto" else ("two_phase" if tier == "host" else "staged")
        if path == "two_phase":                   # device -> the store's own buffers, one copy
            try:
                self.d2s.register_layout(name, layout)
                r = self.d2s.transfer_async(
                    self._job(), TransferSpec(DeviceBlocks(name, todo), StoreBlocks([keys[i] for i in todo], tier=tier))
                ).result()
                if not r.ok:
                    raise _OffloadFailed(r.error)
                return r.nbytes, len(todo)
            finally:
                self.d2s.unregister_layout(name)
        try:
            frames = self.pool.alloc(len(todo))
        except FramePoolFull as exc:
            raise _OffloadFailed(str(exc)) from None
        try:
            self.d2h.register_layout(name, layout)
            r = self.d2h.transfer_async(self._job(), TransferSpec(DeviceBlocks(name, todo), HostFrames(frames))).result()
            if not r.ok:
                raise _OffloadFailed(r.error)
            r = self.to_store.transfer_async(
                self._job(), TransferSpec(HostFrames(frames), StoreBlocks([keys[i] for i in todo], tier=tier))).result()
            if not r.ok:
                raise _OffloadFailed(r.error)
            return r.nbytes, len(todo)
        finally:
            self.d2h.unregister_layout(name)
            self.pool.free(frames)

    def _start_reload(self, rl: Reload) -> None:
        """Store -> frames -> device (layer groups).  Idempotent; resolves ``rl.ready``."""
        with self._job_lock:
            if rl.started.is_set():
                return
            rl.started.set()
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

    def _restored_cache(self, layout: HFLayout, comp) -> tuple[Any, list[float]]:
        """A DynamicCache over the reloaded tensors whose layer l waits for its group on first use."""
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

    def _recompute(self, tr: Any) -> int:
        """Rebuild the cache by one prefill of ``tokens[:cached_len]``; returns tokens recomputed."""
        from transformers import DynamicCache
        cache = DynamicCache(config=self.model.config)
        n = tr.cached_len
        if n:
            with torch.no_grad():
                self.model(input_ids=torch.tensor([tr.tokens[:n]], device=self.device), **{_CACHE_KW: cache},
                           use_cache=True)
        tr.cache = cache
        return n
