"""One node of the cluster model: the one-node simulator plus its cluster hooks.

:class:`ClusterNode` is a :class:`~kvtier.bench.sim.simulator.Simulator`
driven from outside by :class:`~kvtier.bench.sim.cluster.Cluster` (``step``
whenever its next event is the cluster's earliest).  What it adds:

* **Arrivals** come from the cluster (:meth:`arrive`), routed when they arrive.
* **Returns** (:meth:`_on_return`) ask the cluster's router where the resumed
  round runs.  Home: the one-node path.  Elsewhere: the state left here is
  released (HBM, host and NVMe copies; transfers in flight finish into
  nothing) and the session continues on the other node (:meth:`adopt`) with
  no local state there.
* **Publishing.** With a remote tier, a pause whose state the policy keeps
  (any action but recompute) is published: the blocks not yet in the store go
  out over this node's NIC in the background (read from wherever the state
  is; no HBM is held for it).  A policy may override this per pause with
  ``Decision.extra["publish_remote"]`` (0: do not publish, 1: publish; a
  recompute decision never publishes, there is nothing left to read).
* **Remote fill.** A resumed round whose state is not local (``P_NONE``: it
  moved here, or it was dropped) loads the prefix the store holds over this
  node's NIC and prefills the rest, as LMCache or HiCache load whatever
  prefix their remote backend hits.  With ``RemoteConfig.stream_inflight``
  (the default) it may instead wait for a publish still under way and read
  every published block as it lands; it takes whichever of the two brings it
  back sooner on an idle NIC and an idle engine (:meth:`_fill_plan`), and
  recomputes when moving the blocks (latency + blocks / bandwidth, and the
  landing) is slower than prefilling them on an idle engine, as one node does.  The rule ignores both
  queues on purpose: a greedy queue-aware choice recomputed more under load
  and came out worse on mean JCT (docs/cluster.md).  The stall is the fill's
  wait (NIC queue included) plus the prefill time of what it recomputes.
* **Prefetches and moves.** Once a resume of this node has run on another
  node, a planned prefetch does not start while new work waits for admission
  here (:meth:`_try_prefetch`; counted in ``prefetch_deferred``): it would take
  room from the queue until the tool returns, for a resume that may well run
  elsewhere (then the prefetched copy is freed unused).  The resume reloads on
  demand if it comes back here.  With one node, or a router that never moves a
  resume, nothing changes.
* ``active``: rounds routed here and not yet paused, finished or rejected
  (the routers' load signal).

Not thread-safe: the cluster's event loop owns every node.
"""
from __future__ import annotations

from typing import Protocol

from kvtier.tiering.model.decision import Action

from kvtier.bench.sim.cluster_remote import RemoteTier
from kvtier.bench.sim.moves import XFER_EVENT
from kvtier.bench.sim.node import DONE, NEW_Q, P_HBM, P_NONE, PAUSED, RESUME_Q, RUNNING, SessionState
from kvtier.bench.sim.simulator import Simulator
from kvtier.bench.sim.trace import Session
from kvtier.bench.sim.transfers import Transfer


class ClusterView(Protocol):
    """What a node asks of its :class:`~kvtier.bench.sim.cluster.Cluster` (on the cluster's one thread)."""

    @property
    def remote(self) -> RemoteTier | None: ...
    def route_resume(self, home: "ClusterNode", x: SessionState) -> "ClusterNode": ...


REMOTE_GET = -1          # Transfer.kind of a fill over the NIC (not one of the node's Leg servers)
REMOTE_LOADED = -1       # Transfer.then of a fill: handled here, not by the node's state machine


class ClusterNode(Simulator):
    """Node ``index`` of ``cluster`` (see the module docstring)."""

    def __init__(self, index: int, cluster: ClusterView, *args, **kw) -> None:
        super().__init__((), *args, **kw)
        self.index = index
        self.cluster = cluster
        self.remote = cluster.remote
        self.active = 0
        self.moved_out = 0                 # resumed rounds sent to another node
        self.moved_in = 0
        self.remote_fills = 0
        self.remote_fill_tokens = 0
        self.remote_fills_streamed = 0     # fills that waited for blocks still landing
        self.remote_declined = 0           # remote copy there, but recompute was faster
        self.published = 0
        self.prefetch_held = 0             # prefetches not started: admission waiting, resumes moving

    # ------------------------------------------------------------ arrivals and moves
    def arrive(self, s: Session, now: float) -> SessionState:
        """Session ``s`` arrives here at ``now`` (what the ARRIVE event does on one node)."""
        x = SessionState(s)
        self.sessions.append(x)
        self.now = now
        self.events += 1
        self.active += 1
        x.phase = NEW_Q
        self.new_q.append(x)
        self._pump()
        return x

    def _on_return(self, x: SessionState) -> None:
        dest = self.cluster.route_resume(self, x)
        if dest is self:
            self.active += 1
            super()._on_return(x)
            return
        r = x.rounds[x.k]
        self.lifecycle.resume(x.s.id, wait_s=float(r.tool_wait_s or 0.0))
        self.lifecycle.learn()      # the policy observes the wait at the return (a simulation has no timer thread)
        self._idle_flush(x)
        self._unlist(x)
        x.epoch += 1                       # stale: its prefetch, lease and staging events
        x.prefetch_pending = x.stage_pending = False
        self._hbm(x, 0)
        self._set_copy(x, None, 0)
        x.place = P_NONE
        x.phase = DONE                     # a ghost: no blocks, no JCT here (the session goes on there)
        self.moved_out += 1
        y = dest.adopt(x.s, x.k + 1, x.ctx, self.now, defer_pump=True)
        if hasattr(x, "rec"):              # the pause's attribution record goes with it (stall there)
            y.rec, x.rec = x.rec, None
        dest._pump()
        self._pump()                       # the freed HBM may admit queued work here

    def _try_prefetch(self, x: SessionState) -> None:
        if self.moved_out and self.new_q and x.phase == PAUSED and x.moving is None:
            self.m.prefetch_deferred += 1      # reload on demand at resume (module docstring)
            self.prefetch_held += 1
            return
        super()._try_prefetch(x)

    def adopt(self, s: Session, k: int, ctx: int, now: float, *, defer_pump: bool = False) -> SessionState:
        """Session ``s`` resumes here with round ``k`` and ``ctx`` private context tokens, its
        tool having returned at ``now``; nothing of its state is local.  ``defer_pump``: the
        caller runs :meth:`_pump` (after handing over what goes with the session)."""
        y = SessionState(s)
        y.k, y.ctx = k, ctx
        y.phase = RESUME_Q
        y.place = P_NONE
        y.return_t = y.idle_mark = now
        self.sessions.append(y)
        self.now = now
        self.active += 1
        self.moved_in += 1
        self.resume_q.append(y)
        if not defer_pump:
            self._pump()
        return y

    # ------------------------------------------------------------ round ends
    def _pause(self, x: SessionState) -> None:
        self.active -= 1
        super()._pause(x)
        if self.remote is None or x.phase != PAUSED or x.decision is None:
            return
        d = x.decision
        want = (d.extra or {}).get("publish_remote")
        if Action(d.action) == Action.RECOMPUTE or (want is not None and not want):
            return
        if self.remote.publish(self.index, x.s.id, self.blocks(x.ctx), self.now):
            self.published += 1

    def _decode_done(self, x: SessionState) -> None:
        last = x.k == len(x.rounds) - 1
        super()._decode_done(x)
        if last:
            self.active -= 1
            if self.remote is not None:
                self.remote.release(x.s.id)

    def _reject(self, x: SessionState) -> None:
        if x.phase in (NEW_Q, RESUME_Q):
            self.active -= 1
        super()._reject(x)

    # ------------------------------------------------------------ remote fill
    def _start_round(self, x: SessionState) -> None:
        if self.remote is not None and x.k > 0 and x.place == P_NONE and self._remote_fill(x):
            return
        super()._start_round(x)

    def _remote_fill(self, x: SessionState) -> bool:
        """Start loading x's published prefix over the NIC (its HBM is reserved).  False: no
        copy, or recomputing those tokens would be faster (the caller recomputes)."""
        rt, now = self.remote, self.now
        need = self.blocks(x.ctx)
        have = min(rt.available(x.s.id, now), need)
        pub = min(rt.published(x.s.id), need) if rt.cfg.stream_inflight else have
        if pub <= 0:
            return False
        have, stream = self._fill_plan(x, have, pub)
        if have <= 0:
            self.remote_declined += 1
            return False
        tokens = min(x.ctx, have * self.bt)
        r = x.rounds[x.k]
        x.phase = RUNNING
        x.start_t = now
        rest = x.ctx - tokens
        x.need_prefill = rest + r.new_tokens
        self.m.recomputed += rest
        self.remote_fills += 1
        self.remote_fills_streamed += stream
        self.remote_fill_tokens += tokens
        done = rt.fetch(self.index, x.s.id, have, now, stream=stream)
        tr = Transfer(REMOTE_GET, x, have, x.epoch, REMOTE_LOADED)
        tr.target = rest                   # tokens it still recomputes (their prefill is in its stall)
        self.fg_inflight += 1
        x.moving = tr
        x.waiting_reload = True
        self._push(done, XFER_EVENT, tr, 0)
        return True

    def _fill_plan(self, x: SessionState, landed: int, published: int) -> tuple[int, bool]:
        """How many blocks x's fill reads, and whether it streams blocks still landing: the
        landed prefix now, or every published block as it lands, whichever brings x back
        sooner on an idle NIC and an idle engine (load time + prefill of the rest); (0, False)
        when recomputing the whole context is sooner still.  Pure."""
        rt, now, c = self.remote, self.now, self.comp_s_per_token
        best, plan = x.ctx * c, (0, False)
        for k, stream in ((landed, False), (published, True)):
            if k <= 0 or (stream and k <= landed):
                continue
            load = rt.lat + k * rt.per_block
            if stream:
                load = max(load, rt.landing_bound(x.s.id, k) - now)
            est = load + (x.ctx - min(x.ctx, k * self.bt)) * c
            if est < best:
                best, plan = est, (k, stream)
        return plan

    def _on_xfer(self, tr: Transfer) -> None:
        if tr.then != REMOTE_LOADED:
            super()._on_xfer(tr)
            return
        x = tr.sess
        self.fg_inflight -= 1
        if x.moving is tr:
            x.moving = None
        self.remote.end_read(x.s.id)
        x.place = P_HBM
        if x.phase == RUNNING and x.waiting_reload:
            x.waiting_reload = False
            self._resumed(x, tr.target * self.comp_s_per_token)
            self._enqueue_prefill(x)
        self._pump()

    def cluster_stats(self) -> dict:
        return {"node": self.index, "sessions_done": len(self.m.jcts), "resumes": len(self.m.stalls),
                "moved_in": self.moved_in, "moved_out": self.moved_out, "remote_fills": self.remote_fills,
                "prefetches_held_for_admission": self.prefetch_held,
                "hbm_peak_util": self.m.peak_used / self.hbm_total}
