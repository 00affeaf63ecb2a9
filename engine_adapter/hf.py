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

The lifecycle.  Every pause runs on a
:class:`kvtier.tiering.lifecycle.LifecycleController` -- the one the vLLM and
SGLang plugins use (the session makes its own over the store, with a
``kvtier-lifecycle`` timer thread, unless given one as ``lifecycle=``).  The
controller asks the policy once per pause (with the hook's PauseContext), holds
the trajectory's block keys and carries the decision out on the store over
time: a host pause's lease end re-asks the policy (host -> NVMe, renew, or
drop), an NVMe pause is staged NVMe -> host frames at the decision's
``stage_at_s`` (else ``prefetch_at_s``), and the resume releases it and feeds
the observed wait to the policy.  A recompute pause writes nothing.  What only
the hook can do runs through the controller's ``DeviceHooks``
(:mod:`.hf_lifecycle`): a retained cache stays in device memory and its lease
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

Threads: the public methods are meant for one caller thread per session;
the controller's timer thread and the movers touch a trajectory's ``Reload``
record (guarded by its future and the job lock); a lease step holds the
trajectory's lock, and ``resume`` takes the same lock (so it waits for a
step in flight).
"""
from __future__ import annotations

import contextlib
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import torch

from kvtier.dma.layouts import FrameFormat
from kvtier.dma.movers import (DeviceToHostMover, DeviceToStoreMover, HostToDeviceMover, HostToStoreMover,
                        StoreToHostMover)
from kvtier.dma.staging import FramePool
from kvtier.store.keys import Namespace, chain_keys
from kvtier.tiering.model.decision import Action, Decision, PauseContext, Policy

from kvtier.engine_adapter.hf_cache import CACHE_KW as _CACHE_KW
from kvtier.engine_adapter.hf_cache import cache_bytes as _cache_bytes
from kvtier.engine_adapter.hf_cache import free_bytes as _free
from kvtier.engine_adapter.hf_cache import model_id as _model_id
from kvtier.engine_adapter.hf_lifecycle import Demotion, LifecycleHooks, Reload
from kvtier.engine_adapter.hf_transfer import OFFLOAD_PATHS, DeviceTransfers
from kvtier.tiering.lifecycle import Event, ForecastSchedule, LifecycleController, LifecycleTimer
from kvtier.tiering.lifecycle.foreground import Foreground


class SessionError(ValueError):
    """Bad use of a session (unknown trajectory, wrong state, geometry mismatch); state is unchanged."""


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


@dataclass
class _Trajectory:
    tid: str
    tokens: list[int]
    cache: Any | None                 # transformers DynamicCache while on the device
    cached_len: int                   # tokens[:cached_len] have KV in the cache (or stored)
    pending: list[int]                # tokens to feed at the next forward
    paused: bool = False
    tool: str = ""
    t_pause: float = 0.0
    decision: Decision | None = None
    action: Action | None = None
    reload: Reload | None = None
    reload_waits: list[float] | None = None   # filled while the first forward waits on layer groups
    lock: threading.RLock = field(default_factory=threading.RLock)   # pause state vs lease steps
    keys: tuple[bytes, ...] = ()              # content keys of the context at the pause
    kv_bytes: int = 0                         # device KV bytes at the pause
    features: Mapping[str, str] | None = None
    true_wait: float | None = None            # passed to the policy (the oracle reads it)
    scripted_wait: float | None = None        # the tool's known wait (scripted tools), else None
    demotions: list = field(default_factory=list)


class AgentSession(LifecycleHooks, DeviceTransfers):
    """Pause/resume a transformers model's per-trajectory cache through kvtier's movers and store.

    ``policy``: any :class:`kvtier.tiering.model.decision.Policy`; the lifecycle
    controller asks ``decide`` at every pause, ``on_lease_expiry`` at a lease
    end, ``observe(tool, wait)`` at every resume.  ``lifecycle``: a
    ``LifecycleController`` over the same store to run on instead of the
    session's own (the caller then ticks it: a ``ManualClock`` in a test, or
    its own ``LifecycleTimer``); ``policy`` may then be None.  ``store``: an open
    ``store.TieredStore`` whose ``block_bytes`` equals this model's frame size
    (see :meth:`frame_format`).  The session owns its movers; ``close()`` them.
    ``offload_path``: ``"two_phase"`` gathers blocks straight into the store's
    buffers (``prepare_store``/``complete_store``), ``"staged"`` gathers into
    staging frames then ``put_many``; ``"auto"`` (default) takes the one
    measured faster per tier (``python -m kvtier.bench.bench_offload``): two-phase for
    the host tier (1.3-2.0x), staged for NVMe (two-phase's fresh NVMe staging
    memory made it 0.4-0.7x).
    """

    def __init__(self, model: Any, *, store: Any, policy: Policy | None = None, block_tokens: int = 16,
                 layer_groups: int = 2, staging_frames: int = 256, model_id: str | None = None,
                 hbm_pressure: float = 0.0, offload_path: str = "auto",
                 lifecycle: LifecycleController | None = None) -> None:
        if offload_path not in OFFLOAD_PATHS:
            raise SessionError(f"unknown offload_path {offload_path!r}; known: {', '.join(OFFLOAD_PATHS)}")
        self.offload_path = offload_path
        self.model = model
        self.store = store
        self.layer_groups = int(layer_groups)
        self.hbm_pressure = float(hbm_pressure)
        cfg = model.config.get_text_config(decoder=True) if hasattr(model.config, "get_text_config") else model.config
        self.fmt = self.frame_format(model, block_tokens)
        self.device = next(model.parameters()).device
        bad = [t for t in getattr(cfg, "layer_types", None) or [] if t != "full_attention"]
        if bad:
            raise SessionError(f"only full-attention caches are supported, model has {sorted(set(bad))}")
        store_block = getattr(getattr(store, "config", None), "block_bytes", self.fmt.frame_bytes)
        if store_block != self.fmt.frame_bytes:
            raise SessionError(f"store block_bytes {store_block} != this model's frame size {self.fmt.frame_bytes} "
                               f"({block_tokens} tokens x {self.fmt.layers} layers)")
        self.namespace = Namespace(model_id=model_id or _model_id(model), dtype=str(self.fmt.dtype).split(".")[-1],
                                   layout=f"hf-frame-T{block_tokens}")
        self._traj: dict[str, _Trajectory] = {}
        self._jobs = iter(range(1, 1 << 62))
        self._job_lock = threading.Lock()
        self.lifecycle, self._timer = self._attach(lifecycle, policy)
        self.policy = getattr(self.lifecycle.schedule, "policy", policy)
        self.pool = FramePool(self.fmt, staging_frames)
        self.d2h, self.h2d = DeviceToHostMover(self.pool), HostToDeviceMover(self.pool)
        self.to_store, self.from_store = HostToStoreMover(self.pool, store), StoreToHostMover(self.pool, store)
        self.d2s = DeviceToStoreMover(self.pool, store)

    def _attach(self, ctl: LifecycleController | None, policy: Policy | None):
        """The controller to run on (the session's own, with its timer thread, or ``ctl``);
        registers this session's DeviceHooks.  Raises SessionError for a mismatch."""
        if ctl is None:
            if policy is None:
                raise SessionError("AgentSession needs a policy or a lifecycle controller")
            ctl = LifecycleController(self.store, ForecastSchedule(policy), block_bytes=self.fmt.frame_bytes,
                                      device=self)
            ctl.foreground = Foreground()          # resumes first: background moves yield to them
            return ctl, LifecycleTimer(ctl).start()
        if ctl.store is not self.store:
            raise SessionError("the lifecycle controller drives another store")
        if ctl.block_bytes != self.fmt.frame_bytes:
            raise SessionError(f"lifecycle block_bytes {ctl.block_bytes} != this model's frame size "
                               f"{self.fmt.frame_bytes}")
        own = getattr(ctl.schedule, "policy", None)
        if policy is not None and own is not None and own is not policy:
            raise SessionError("policy differs from the lifecycle controller's schedule policy")
        ctl.set_device(self)
        return ctl, None

    # -- geometry ------------------------------------------------------------
    @staticmethod
    def frame_format(model: Any, block_tokens: int = 16) -> FrameFormat:
        """The stored frame of one block of ``block_tokens`` tokens for ``model``."""
        cfg = model.config.get_text_config(decoder=True) if hasattr(model.config, "get_text_config") else model.config
        heads = cfg.num_attention_heads
        kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        dtype = next(model.parameters()).dtype
        return FrameFormat(layers=cfg.num_hidden_layers, block_tokens=block_tokens, kv_heads=kv_heads,
                           head_dim=head_dim, dtype=dtype)

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
        if tid in self._traj:
            raise SessionError(f"trajectory {tid!r} already exists")
        prompt = [int(t) for t in prompt]
        if not prompt:
            raise SessionError("prompt must not be empty")
        if cache is not None:
            self._check_cache(cache)
            n = cache.get_seq_length()
            if n != len(prompt) - 1:
                raise SessionError(f"cache holds {n} tokens, expected {len(prompt) - 1} (prompt minus its last token)")
            self._traj[tid] = _Trajectory(tid, prompt, cache, n, prompt[n:])
        else:
            self._traj[tid] = _Trajectory(tid, prompt, None, 0, list(prompt))

    def generate(self, tid: str, max_new_tokens: int) -> TurnOutput:
        """Greedy-decode ``max_new_tokens`` tokens; mutates the trajectory.  SessionError if paused/unknown."""
        tr = self._active(tid)
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
        tr = self._active(tid)
        tr.tokens.extend(int(t) for t in tokens)
        tr.pending.extend(int(t) for t in tokens)

    def device_kv_bytes(self, tid: str | None = None) -> int:
        """Bytes of KV tensors the session holds on the device (one trajectory, or all)."""
        trs = [self._get(tid)] if tid is not None else list(self._traj.values())
        return sum(_cache_bytes(t.cache) for t in trs if t.cache is not None)

    def pause(self, tid: str, tool: str, *, features: Mapping[str, str] | None = None,
              true_wait_s: float | None = None, scripted_wait_s: float | None = None) -> PauseReport:
        """The trajectory waits for ``tool``: decide, offload/drop, hand the pause to the lifecycle.

        ``true_wait_s`` is passed to the policy (only the oracle reads it).
        ``scripted_wait_s``: the caller knows the tool's wait (a scripted or
        simulated tool); the policy is not told, but leases are settled against
        it and the resume feeds it to ``policy.observe`` (see the module doc).
        Raises SessionError (state unchanged) for an unknown/paused trajectory,
        an empty tool name, a cache whose geometry does not match the model, or
        a bad scripted wait.
        """
        tr = self._active(tid)
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
            decision = self._decide(tr)
            action, reason = decision.action, decision.reason
            if tr.cache is None or not keys:
                action, reason = (Action.RETAIN, "empty cache") if action != Action.RETAIN else (action, reason)
            action, reason, moved, blocks_moved, offload_s = self._leave_device(tr, action, reason, keys, stored)
            freed = kv_bytes if action != Action.RETAIN else 0
            tr.paused, tr.t_pause, tr.action, tr.decision = True, time.monotonic(), action, decision
            tr.demotions = []
            tr.reload, timers = None, ()
            if action in (Action.OFFLOAD_HOST, Action.OFFLOAD_NVME):
                at = None if decision.prefetch_at_s is None else max(0.0, decision.prefetch_at_s)
                tr.reload = Reload(keys=keys, seq_len=tr.cached_len, at_s=at)
                timers = () if at is None else ((at, Event.RELOAD),)
            self.lifecycle.pause(tid, tier=Action(action).tier if keys else None, timers=timers,
                                 until_s=scripted_wait_s)       # nothing armed past a known return
            return PauseReport(tid, tool, action, decision.action, reason, kv_bytes, moved, blocks_moved,
                               sum(stored), offload_s, freed, tr.reload.at_s if tr.reload else None,
                               self._lease_at(tr), dict(decision.extra))

    def _decide(self, tr: _Trajectory) -> Decision:
        """Ask the lifecycle controller for ``tr``'s pause plan (it asks the policy once, with
        the hook's PauseContext); a schedule without a Decision (TTL) gives its plan's tier."""
        ctl = self.lifecycle
        ctl.hint(tr.tid, tr.tool, features=tr.features, context_tokens=tr.cached_len)
        ctl.set_blocks(tr.tid, tr.keys)
        plan = ctl.plan_for(tr.tid)
        d = ctl.decision(tr.tid)
        if isinstance(d, Decision):
            return d
        by_tier = {None: Action.RECOMPUTE, "host": Action.OFFLOAD_HOST, "nvme": Action.OFFLOAD_NVME}
        return Decision(by_tier.get(plan.tier, Action.OFFLOAD_HOST), reason=plan.reason)

    @staticmethod
    def _lease_at(tr: _Trajectory) -> float | None:
        """The pause's lease time if it can expire: a placement with a lease, before a scripted return."""
        at = tr.decision.demote_at_s
        if at is None or tr.action != tr.decision.action or tr.action not in (Action.RETAIN, Action.OFFLOAD_HOST):
            return None
        return None if tr.scripted_wait is not None and at >= tr.scripted_wait else at

    def wait_prefetched(self, tid: str, timeout: float | None = None) -> bool:
        """Block until a paused trajectory's reload is on the device (True), or it missed (False).

        Starts nothing: a reload whose prefetch time has not come yet is waited for (a reload
        planned for the resume never comes: TimeoutError after ``timeout``).
        """
        tr = self._get(tid)
        if tr.reload is None:
            return tr.cache is not None
        got = tr.reload.ready.result(timeout)
        if got is None:
            return False
        got[1].result(timeout)
        return True

    def placement(self, tid: str) -> Action | None:
        """Where a paused trajectory's KV is now (changes when a lease demotes it); None if not paused."""
        tr = self._get(tid)
        with tr.lock:
            return tr.action if tr.paused else None

    def resume(self, tid: str, observation: Sequence[int] = ()) -> ResumeReport:
        """The tool returned: settle leases, observe the wait, restore the cache, queue ``observation``.

        Raises SessionError for an unknown trajectory or one that is not paused
        (e.g. resumed twice); state unchanged then.
        """
        tr = self._get(tid)
        if not tr.paused:
            raise SessionError(f"trajectory {tid!r} is not paused (already resumed?)")
        if tr.scripted_wait is not None:          # lease ends due in scripted time the clock has not reached
            self.lifecycle.settle(tid, tr.scripted_wait)
        with tr.lock:                             # waits for a lease step in flight
            wall = time.monotonic() - tr.t_pause
            observed = self.lifecycle.resume(tid, wait_s=tr.scripted_wait)   # cancels its timers
            self.lifecycle.learn()                # the policy observes the wait now: a session has no other thread
            wait_s = observed if observed is not None else (wall if tr.scripted_wait is None else tr.scripted_wait)
            action, stall, recomputed, fallback, loaded = tr.action, 0.0, 0, "", 0
            prefetched = action == Action.RETAIN
            if action in (Action.OFFLOAD_HOST, Action.OFFLOAD_NVME):
                rl = tr.reload
                prefetched = rl.ready.done() and rl.ready.result() is not None and rl.ready.result()[1].done()
                t0 = time.perf_counter()
                with self._loading():                 # the controller's moves step aside meanwhile
                    self._start_reload(rl)            # no-op if the prefetch already started
                    got = rl.ready.result()
                if got is not None:
                    got[1].wait_group(0)              # first layers usable; later groups land during compute
                if not prefetched:                    # only time actually spent waiting counts as stall
                    stall += time.perf_counter() - t0
                if got is None:
                    fallback = f"{len(rl.missing)} block(s) missing or corrupt in the store"
                else:
                    tr.cache, tr.reload_waits = self._restored_cache(*got)
                    loaded = rl.bytes_loaded
                tr.reload = None
            if action == Action.RECOMPUTE or fallback:
                t0 = time.perf_counter()
                recomputed = self._recompute(tr)
                stall += time.perf_counter() - t0
            tr.paused = False
            demotions = tuple(tr.demotions)
        self.append(tid, observation)
        return ResumeReport(tid, tr.tool, action, wait_s, stall, prefetched, recomputed, loaded, fallback,
                            wall, demotions)

    def _loading(self):
        """The controller's engine-load gate (its demotions and stagings wait while the resume loads)."""
        fg = getattr(self.lifecycle, "foreground", None)
        return fg.loading() if fg is not None else contextlib.nullcontext()

    def close(self) -> None:
        """Stop the lifecycle timer (the session's own) and the movers (idempotent).
        Stored blocks stay in the store."""
        if self._timer is not None:
            self._timer.close()                   # joins: a lease step or reload in flight finishes
        if self.lifecycle.device is self:
            self.lifecycle.set_device(None)
        for m in (self.d2h, self.h2d, self.to_store, self.from_store, self.d2s):
            m.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- internals -----------------------------------------------------------
    def _get(self, tid: str) -> _Trajectory:
        try:
            return self._traj[tid]
        except KeyError:
            raise SessionError(f"unknown trajectory {tid!r}") from None

    def _active(self, tid: str) -> _Trajectory:
        tr = self._get(tid)
        if tr.paused:
            raise SessionError(f"trajectory {tid!r} is paused for {tr.tool!r}; resume it first")
        return tr

    def _job(self) -> int:
        with self._job_lock:
            return next(self._jobs)

    def _context(self, tr: _Trajectory, tool: str, keys, kv_bytes: int, placement: Action,
                 features=None, true_wait_s=None, *, now_s: float | None = None) -> tuple[PauseContext, list[bool]]:
        """The PauseContext for a decision from ``placement`` (RETAIN: on the device; OFFLOAD_HOST:
        in the host tier) and, per key, whether the block is already where the next step puts it
        (RETAIN: stored anywhere; OFFLOAD_HOST: on NVMe).  ``new_bytes`` counts the others' tokens."""
        if placement == Action.RETAIN:
            have = [bool(self.store.contains(k)) for k in keys]
        else:
            have = ["nvme" in {str(t) for t in self.store.where(k)} for k in keys]
        free = _free(self.store)
        T, token_bytes = self.fmt.block_tokens, self.fmt.layer_bytes * self.fmt.layers // self.fmt.block_tokens
        new_tokens = sum(min(T, tr.cached_len - i * T) for i, h in enumerate(have) if not h)
        ctx = PauseContext(tool=tool, kv_bytes=kv_bytes, context_tokens=tr.cached_len,
                           new_bytes=min(kv_bytes, new_tokens * token_bytes), hbm_pressure=self.hbm_pressure,
                           host_free_bytes=free["host"], nvme_free_bytes=free["nvme"],
                           now_s=time.time() if now_s is None else now_s, true_wait_s=true_wait_s,
                           features=features, trajectory_id=tr.tid)
        return ctx, have

