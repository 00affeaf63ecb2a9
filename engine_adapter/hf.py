"""Agent sessions over a transformers causal LM, with kvtier offload on every tool pause.

::

    s = AgentSession(model, store=store, policy=policy)
    s.start("t1", prompt_ids)
    out = s.generate("t1", 8)                 # greedy turn (tokens + logits)
    p = s.pause("t1", tool="pytest")          # policy.decide(PauseContext) -> action
    ...                                       # tool runs; prefetch starts at p.prefetch_at_s
    r = s.resume("t1", observation_ids)       # policy.observe(tool, wait); restore; stall measured
    out = s.generate("t1", 8)

Per pause, the policy's action is carried out:

    retain        nothing moves; the cache stays on the device
    offload_host  cache blocks -> D2H -> staging frames -> store (host tier); device cache freed
    offload_nvme  same, into the store's NVMe tier
    recompute     device cache freed; resume rebuilds it by prefill of the context tokens

Offloaded blocks are content-addressed (:func:`kvtier.store.keys.chain_keys` over the
context tokens), so a second pause moves only blocks the store does not hold
yet.  The reload (store -> frames -> H2D in layer groups) starts at the
decision's ``prefetch_at_s`` (None: when the tool returns); the restored
cache's layers each wait for their own group, so the first layers compute
while the later ones stream in.

The lifecycle.  Every pause runs on a :class:`kvtier.engine_adapter.wiring.Lifecycle`
-- the controller and timer thread the vLLM and SGLang plugins run on (the
session makes its own over the store, with a ``kvtier-lifecycle`` timer thread,
unless given one as ``lifecycle=``): one ``Lifecycle.hold`` per pause, one
``Lifecycle.release`` per resume.  The
controller asks the policy once per pause (with the hook's PauseContext), holds
the trajectory's block keys and carries the decision out on the store over
time: a host pause's lease end re-asks the policy (host -> NVMe, renew, or
drop), an NVMe pause is staged NVMe -> host frames at the decision's
``stage_at_s`` (else ``prefetch_at_s``), and the resume releases it and feeds
the observed wait to the policy.  A recompute pause writes nothing.  What only
the hook can do is in :mod:`.hf_lifecycle`: the pause's device step (the
``place`` of ``Lifecycle.hold``) and the controller's ``DeviceHooks``: a retained cache stays in device memory and its lease
end offloads it (HBM -> host / NVMe) or drops it; the device reload starts on
an ``Event.RELOAD`` timer.

Scripted waits (``pause(..., scripted_wait_s=W)``: a simulated tool whose wait
the caller knows): the resume first has the controller carry out the lease
ends due before ``W`` that its clock has not reached (fast-forwarded time, a
loaded machine), each asked at its own lease time, and feeds ``W`` (not the
wall time) back.  Decisions and bytes moved are then the same on every run.

Faults never lose a trajectory: a store that is full falls back to recompute
at pause time; a block missing or corrupt at reload falls back to recompute
at resume time.  Tokens after a host/NVMe round trip are identical to an
uninterrupted run (and so are logits); after recompute tokens are identical
and logits equal within float tolerance.

The session is a front that checks input and forwards to parts built in
order and closed in reverse::

    AgentSession
      |-- trajectories: Trajectories     the records, one per trajectory (hf_trajectory)
      |-- transfers: DeviceTransfers     staging frames, movers; offload / reload / recompute (hf_transfer)
      |-- hooks: SessionHooks            the controller's DeviceHooks (hf_lifecycle)
      |-- lifecycle: Lifecycle           controller + timer thread + engine-load gate (wiring)

Threads: the public methods are meant for one caller thread per session;
the controller's timer thread and the movers touch a trajectory's ``Reload``
record (guarded by its future and the transfers' job lock); a lease step holds
the trajectory's lock, and ``resume`` takes the same lock after releasing the
pause (so it waits for a step in flight).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import torch

from kvtier.dma.layouts import FrameFormat
from kvtier.engine_adapter.geometry import kv_shape, layer_types
from kvtier.engine_adapter.hf_cache import CACHE_KW as _CACHE_KW
from kvtier.engine_adapter.hf_cache import cache_bytes as _cache_bytes
from kvtier.engine_adapter.hf_cache import model_id as _model_id
from kvtier.engine_adapter.hf_lifecycle import PauseContexts, PauseStep, SessionHooks, own_lifecycle
from kvtier.engine_adapter.hf_trajectory import OFFLOADS, Demotion, HFTrajectory, SessionError, Trajectories
from kvtier.engine_adapter.hf_transfer import DeviceTransfers, OffloadPath
from kvtier.engine_adapter.wiring import Lifecycle
from kvtier.store.keys import Namespace, chain_keys
from kvtier.tiering.model.decision import Action, Policy

if TYPE_CHECKING:
    from kvtier.store.tiered import TieredStore

__all__ = ["AgentSession", "SessionError", "TurnOutput", "PauseReport", "ResumeReport", "Demotion", "OffloadPath"]


@dataclass(frozen=True)
class TurnOutput:
    """Greedy tokens of one turn and the logits that chose them (``[n, vocab]``, float32, CPU)."""

    tokens: tuple[int, ...]
    logits: torch.Tensor
    reload_wait_s: float = 0.0     # time this turn's first forward waited on reload layer groups


@dataclass(frozen=True)
class PauseReport:
    trajectory_id: str
    tool: str
    action: Action                 # what was done (may differ from the decision: fallback)
    decided: Action                # what the policy asked for
    reason: str
    kv_bytes: int                  # device KV state at the pause
    bytes_moved: int               # bytes written to the store at this pause
    blocks_moved: int
    blocks_reused: int             # blocks the store already held (earlier pause / shared prefix)
    offload_s: float               # wall time of D2H + store writes
    freed_bytes: int               # device KV bytes released at the pause
    prefetch_at_s: float | None    # reload start, seconds after the pause
    demote_at_s: float | None = None   # lease expiry, seconds after the pause (armed only if it can expire)
    costs: Mapping[str, float] = field(default_factory=dict)   # the decision's per-action costs, if it gave them


@dataclass(frozen=True)
class ResumeReport:
    trajectory_id: str
    tool: str
    action: Action                 # the placement the state was restored from (after any demotion)
    wait_s: float                  # the wait fed to policy.observe (scripted, else measured)
    resume_stall_s: float          # time spent blocked on the reload or the recompute
    prefetched: bool               # the reload was complete when the tool returned
    recomputed_tokens: int
    bytes_loaded: int
    fallback: str = ""             # why a reload became a recompute, if it did
    wall_wait_s: float = 0.0       # measured pause -> resume wall time
    demotions: tuple[Demotion, ...] = ()


@dataclass(frozen=True)
class _Restored:
    """How a resume brought a paused cache back (see :meth:`AgentSession._restore`)."""

    stall_s: float
    prefetched: bool
    recomputed_tokens: int = 0
    bytes_loaded: int = 0
    fallback: str = ""


class AgentSession:
    """Pause/resume a transformers model's per-trajectory cache through kvtier's movers and store.

    ``policy``: any :class:`kvtier.tiering.model.decision.Policy`; the session
    then runs on a lifecycle of its own (:func:`~.hf_lifecycle.own_lifecycle`)
    whose controller asks ``decide`` at every pause, ``on_lease_expiry`` at a
    lease end, ``observe(tool, wait)`` at every resume.  ``lifecycle``: a
    :class:`~kvtier.engine_adapter.wiring.Lifecycle` over the same store to run
    on instead (its schedule decides; the caller ticks and closes it: a
    ``ManualClock`` in a test, or its own timer thread).  One of the two.
    ``store``: an open ``store.TieredStore`` whose ``block_bytes`` equals this
    model's frame size (see :meth:`frame_format`).  ``offload_path``: how an
    offload reaches the store (:class:`~.hf_transfer.OffloadPath`, or its value).
    The session owns its movers and its own lifecycle; ``close()`` them.
    Raises SessionError for a bad argument, a model with other than
    full-attention layers, or a store / lifecycle of another frame size.
    """

    def __init__(self, model: Any, *, store: "TieredStore", policy: Policy | None = None, block_tokens: int = 16,
                 layer_groups: int = 2, staging_frames: int = 256, model_id: str | None = None,
                 hbm_pressure: float = 0.0, offload_path: OffloadPath | str = OffloadPath.AUTO,
                 lifecycle: Lifecycle | None = None) -> None:
        try:
            path = OffloadPath(offload_path)
        except ValueError:
            raise SessionError(f"unknown offload_path {offload_path!r}; "
                               f"known: {', '.join(p.value for p in OffloadPath)}") from None
        if (policy is None) == (lifecycle is None):
            raise SessionError("AgentSession needs a policy or a lifecycle (one of them, not both)")
        self.model, self.store = model, store
        self.fmt = fmt = self.frame_format(model, block_tokens)
        bad = [t for t in layer_types(model.config) if t != "full_attention"]
        if bad:
            raise SessionError(f"only full-attention caches are supported, model has {sorted(set(bad))}")
        if store.config.block_bytes != fmt.frame_bytes:
            raise SessionError(f"store block_bytes {store.config.block_bytes} != this model's frame size "
                               f"{fmt.frame_bytes} ({block_tokens} tokens x {fmt.layers} layers)")
        if lifecycle is not None:
            _check_lifecycle(lifecycle, store, fmt.frame_bytes)
        self.namespace = Namespace(model_id=model_id or _model_id(model), dtype=str(fmt.dtype).split(".")[-1],
                                   layout=f"hf-frame-T{block_tokens}")
        self.device = next(model.parameters()).device
        self.trajectories = Trajectories()
        self.transfers = DeviceTransfers(model, fmt, store, device=self.device, layer_groups=layer_groups,
                                         staging_frames=staging_frames, offload_path=path)
        self._closers = [self._detach, self.transfers.close]     # close() calls these in this order
        if lifecycle is None:
            lifecycle = own_lifecycle(store, policy, block_bytes=fmt.frame_bytes)
            self._closers.insert(0, lifecycle.close)  # joins the timer: a lease step or reload in flight finishes
        self.lifecycle = lifecycle
        self.hooks = SessionHooks(self.trajectories, self.transfers, PauseContexts(store, fmt, hbm_pressure), store,
                                  lifecycle.controller)
        lifecycle.controller.set_device(self.hooks)

    # -- geometry ------------------------------------------------------------
    @staticmethod
    def frame_format(model: Any, block_tokens: int = 16) -> FrameFormat:
        """The stored frame of one block of ``block_tokens`` tokens for ``model``."""
        shape = kv_shape(model.config)
        return FrameFormat(layers=shape.layers, block_tokens=block_tokens, kv_heads=shape.kv_heads,
                           head_dim=shape.head_dim, dtype=next(model.parameters()).dtype)

    def _check_cache(self, cache: Any) -> None:
        """Raise SessionError unless ``cache`` has this model's geometry (layers, heads, head dim, dtype)."""
        f = self.fmt
        layers = getattr(cache, "layers", None)
        if layers is None or len(layers) != f.layers:
            raise SessionError(f"cache has {len(layers) if layers is not None else 'no'} layers, model has {f.layers}")
        seq = None
        for i, layer in enumerate(layers):
            for t in (layer.keys, layer.values):
                if t is None or t.dim() != 4 or t.shape[0] != 1 or t.shape[1] != f.kv_heads \
                        or t.shape[3] != f.head_dim or t.dtype != f.dtype:
                    shape = None if t is None else (tuple(t.shape), t.dtype)
                    raise SessionError(f"cache layer {i} is {shape}, model expects "
                                       f"[1, {f.kv_heads}, seq, {f.head_dim}] {f.dtype}")
                seq = t.shape[2] if seq is None else seq
                if t.shape[2] != seq:
                    raise SessionError(f"cache layer {i} holds {t.shape[2]} tokens, layer 0 holds {seq}")

    # -- public API ----------------------------------------------------------
    def start(self, tid: str, prompt: Sequence[int], cache: Any | None = None) -> None:
        """Register trajectory ``tid``.  ``cache`` (optional) already holds ``prompt[:-1]``.

        Raises SessionError for a duplicate id, an empty prompt or a cache of the wrong geometry.
        """
        if self.trajectories.find(tid) is not None:
            raise SessionError(f"trajectory {tid!r} already exists")
        prompt = [int(t) for t in prompt]
        if not prompt:
            raise SessionError("prompt must not be empty")
        if cache is not None:
            self._check_cache(cache)
            n = cache.get_seq_length()
            if n != len(prompt) - 1:
                raise SessionError(f"cache holds {n} tokens, expected {len(prompt) - 1} (prompt minus its last token)")
            self.trajectories.add(HFTrajectory(tid, prompt, cache, n, prompt[n:]))
        else:
            self.trajectories.add(HFTrajectory(tid, prompt, None, 0, list(prompt)))

    def generate(self, tid: str, max_new_tokens: int) -> TurnOutput:
        """Greedy-decode ``max_new_tokens`` tokens; mutates the trajectory.  SessionError if paused/unknown."""
        tr = self.trajectories.active(tid)
        if max_new_tokens < 1:
            raise SessionError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        from transformers import DynamicCache
        if tr.cache is None:
            tr.cache = DynamicCache(config=self.model.config)
        toks, logits = [], []
        feed = tr.pending
        with torch.no_grad():
            for _ in range(max_new_tokens):
                out = self.model(input_ids=torch.tensor([feed], device=self.device), **{_CACHE_KW: tr.cache},
                                 use_cache=True)
                last = out.logits[0, -1].float()
                tok = int(torch.argmax(last))
                tr.cached_len += len(feed)
                tr.tokens.append(tok)
                toks.append(tok)
                logits.append(last.cpu())
                feed = [tok]
        tr.pending = feed
        waited = sum(tr.reload_waits or ())
        tr.reload_waits = None
        return TurnOutput(tuple(toks), torch.stack(logits), waited)

    def append(self, tid: str, tokens: Sequence[int]) -> None:
        """Queue ``tokens`` (e.g. a tool observation) as input of the next turn of an active trajectory."""
        tr = self.trajectories.active(tid)
        tr.tokens.extend(int(t) for t in tokens)
        tr.pending.extend(int(t) for t in tokens)

    def device_kv_bytes(self, tid: str | None = None) -> int:
        """Bytes of KV tensors the session holds on the device (one trajectory, or all)."""
        trs = [self.trajectories.get(tid)] if tid is not None else self.trajectories.all()
        return sum(_cache_bytes(t.cache) for t in trs if t.cache is not None)

    def pause(self, tid: str, tool: str, *, features: Mapping[str, str] | None = None,
              true_wait_s: float | None = None, scripted_wait_s: float | None = None) -> PauseReport:
        """The trajectory waits for ``tool``: one ``Lifecycle.hold`` decides, the device
        step (:class:`~.hf_lifecycle.PauseStep`) offloads / drops / keeps the cache, and
        the lifecycle carries the pause on from there.

        ``true_wait_s`` is passed to the policy (only the oracle reads it).
        ``scripted_wait_s``: the caller knows the tool's wait (a scripted or
        simulated tool); the policy is not told, but leases are settled against
        it and the resume feeds it to ``policy.observe`` (see the module doc).
        Raises SessionError (state unchanged) for an unknown/paused trajectory,
        an empty tool name, a cache whose geometry does not match the model, or
        a bad scripted wait.
        """
        tr = self.trajectories.active(tid)
        if not isinstance(tool, str) or not tool:
            raise SessionError(f"tool must be a non-empty string, got {tool!r}")
        if scripted_wait_s is not None and not (isinstance(scripted_wait_s, (int, float))
                                                and math.isfinite(scripted_wait_s) and scripted_wait_s >= 0):
            raise SessionError(f"scripted_wait_s must be a finite number >= 0, got {scripted_wait_s!r}")
        with tr.lock:
            if tr.cache is not None:
                self._check_cache(tr.cache)
            kv_bytes = _cache_bytes(tr.cache)
            context = tr.tokens[:tr.cached_len]
            keys = tuple(chain_keys(context, self.fmt.block_tokens, self.namespace, partial=True)) if context else ()
            tr.tool, tr.keys, tr.kv_bytes, tr.features = tool, keys, kv_bytes, features
            tr.true_wait, tr.scripted_wait = true_wait_s, scripted_wait_s
            stored = [bool(self.store.contains(k)) for k in keys]   # a broken store raises here, before the plan
            step = PauseStep(tr, self.transfers, stored)
            self.lifecycle.hold(tid, tool, keys, context_tokens=tr.cached_len, features=features, place=step,
                                until_s=scripted_wait_s)           # nothing armed past a known return
            dep, order = step.departure, step.order
            return PauseReport(tid, tool, dep.action, order.action, step.reason, kv_bytes, dep.bytes_moved,
                               dep.blocks_moved, sum(stored), dep.seconds,
                               kv_bytes if dep.action != Action.RETAIN else 0,
                               tr.reload.at_s if tr.reload else None, tr.lease_at(), dict(order.costs))

    def wait_prefetched(self, tid: str, timeout: float | None = None) -> bool:
        """Block until a paused trajectory's reload is on the device (True), or it missed (False).

        Starts nothing: a reload whose prefetch time has not come yet is waited for (a reload
        planned for the resume never comes: TimeoutError after ``timeout``).
        """
        tr = self.trajectories.get(tid)
        if tr.reload is None:
            return tr.cache is not None
        got = tr.reload.ready.result(timeout)
        if got is None:
            return False
        got[1].result(timeout)
        return True

    def placement(self, tid: str) -> Action | None:
        """Where a paused trajectory's KV is now (changes when a lease demotes it); None if not paused."""
        tr = self.trajectories.get(tid)
        with tr.lock:
            return tr.action if tr.paused else None

    def resume(self, tid: str, observation: Sequence[int] = ()) -> ResumeReport:
        """The tool returned: one ``Lifecycle.release`` (settle leases, observe the wait),
        then restore the cache and queue ``observation``.

        Raises SessionError for an unknown trajectory or one that is not paused
        (e.g. resumed twice); state unchanged then.
        """
        tr = self.trajectories.get(tid)
        if not tr.paused:
            raise SessionError(f"trajectory {tid!r} is not paused (already resumed?)")
        observed = self.lifecycle.release(tid, wait_s=tr.scripted_wait)   # outside tr.lock: lease steps take it
        with tr.lock:                             # waits for a lease step in flight
            wall = time.monotonic() - tr.t_pause
            wait_s = observed if observed is not None else (wall if tr.scripted_wait is None else tr.scripted_wait)
            action = tr.action
            got = self._restore(tr)
            tr.paused = False
            demotions = tuple(tr.demotions)
        self.append(tid, observation)
        return ResumeReport(tid, tr.tool, action, wait_s, got.stall_s, got.prefetched, got.recomputed_tokens,
                            got.bytes_loaded, got.fallback, wall, demotions)

    def _restore(self, tr: HFTrajectory) -> _Restored:
        """Bring ``tr``'s cache back to the device from where it is (caller holds ``tr.lock``):
        reload it (started now unless its prefetch already ran) or recompute it."""
        if tr.action == Action.RETAIN:
            return _Restored(0.0, True)
        stall, prefetched, loaded, fallback = 0.0, False, 0, ""
        if tr.action in OFFLOADS:
            rl = tr.reload
            prefetched = rl.ready.done() and rl.ready.result() is not None and rl.ready.result()[1].done()
            t0 = time.perf_counter()
            with self.lifecycle.loading():        # the controller's moves step aside meanwhile
                self.transfers.start_reload(rl)   # no-op if the prefetch already started
                got = rl.ready.result()
            if got is not None:
                got[1].wait_group(0)              # first layers usable; later groups land during compute
            if not prefetched:                    # only time actually spent waiting counts as stall
                stall += time.perf_counter() - t0
            if got is None:
                fallback = f"{len(rl.missing)} block(s) missing or corrupt in the store"
            else:
                tr.cache, tr.reload_waits = self.transfers.restored_cache(*got)
                loaded = rl.bytes_loaded
            tr.reload = None
            if not fallback:
                return _Restored(stall, prefetched, 0, loaded, "")
        t0 = time.perf_counter()
        tr.cache = self.transfers.recompute(tr.tokens[:tr.cached_len])
        return _Restored(stall + time.perf_counter() - t0, prefetched, tr.cached_len, loaded, fallback)

    def _detach(self) -> None:
        controller = self.lifecycle.controller
        if controller.device is self.hooks:
            controller.set_device(None)

    def close(self) -> None:
        """Stop the session's own lifecycle (its timer thread) and the movers, and detach
        from the controller (idempotent).  Stored blocks stay in the store."""
        for close in self._closers:
            close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _check_lifecycle(lifecycle: Lifecycle, store: Any, frame_bytes: int) -> None:
    """Raise SessionError unless ``lifecycle``'s controller drives ``store`` in frames of ``frame_bytes``."""
    ctl = lifecycle.controller
    if ctl.store is not store:
        raise SessionError("the lifecycle controller drives another store")
    if ctl.block_bytes != frame_bytes:
        raise SessionError(f"lifecycle block_bytes {ctl.block_bytes} != this model's frame size {frame_bytes}")
