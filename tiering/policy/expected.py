"""The expected-cost decision of :class:`~kvtier.tiering.policy.breakeven.BreakEvenPolicy`, in pieces.

:func:`decide_expected` prices retain / offload_host / offload_nvme /
recompute over a :class:`~kvtier.tiering.forecasting.forecast.WaitDistribution` (see
:mod:`kvtier.tiering.policy.policies` for the model) and plans the chosen action's
way back (prefetch, staging, lease).  The shared link is a queue: a copy-out
waits ``ctx.link_out_queue_s`` before it starts (HBM held meanwhile), a reload
``ctx.link_in_queue_s`` (prefetches start that much earlier), NVMe likewise;
and each second of link time is charged the shadow price
``link_weight * stall_weight * rho / (1 - rho)`` (the transfers it delays,
``rho`` = ``ctx.link_utilisation``).  With every queue field 0 this is the
model without queues.

The decision's ``extra`` holds every action's cost and, for the chosen one,
what it expects to happen (``exp_hold_gbs``, ``exp_transfer_s``,
``exp_link_queue_s``, ``exp_nvme_queue_s``, ``exp_stall_s``,
``exp_recompute_s``), which the simulator's per-pause attribution sets
against the outcome.  Pure functions (thread-safe).
"""
from __future__ import annotations

from bisect import bisect_left

import numpy as np

from kvtier.tiering.policy.breakeven_options import Lease, PricedPolicy, Queues
from kvtier.tiering.model.costmodel import GB
from kvtier.tiering.model.decision import Action, Decision, PauseContext, make_decision
from kvtier.tiering.forecasting.forecast import WaitDistribution, WaitForecast
from kvtier.tiering.policy.pricing import best_lease, best_prefetch, expected_stall


_ACTIONS = {a.value: a for a in Action}
_INF = float("inf")
MAX_RHO = 0.95             # utilisation past which the link's shadow price stops growing


class _Terms:
    """The physical terms of one pause (plain data, built per decision)."""

    __slots__ = ("kv", "move", "g", "gm", "phi", "c_h", "ew", "sw", "in_hbm", "t_out", "x_out", "r_h", "x_in",
                 "q_out", "q_in", "t_rc", "lam", "host_ok", "nvme_ok", "dram", "hold", "nvme_rate",
                 "t_w", "t_rd", "r_n", "q_nw", "q_nr", "lead", "lc", "evict_p", "evict_h", "evict_q")

    def __init__(self, p: PricedPolicy, ctx: PauseContext, in_hbm: bool) -> None:
        pr, hw = p.prices, p.hardware
        kv = self.kv = ctx.kv_bytes
        nb = ctx.new_bytes
        move = self.move = kv if nb is None else nb
        self.g, self.gm = g, gm = kv / GB, move / GB
        o = p.options
        ref_gb = p.ref_gb
        self.phi = phi = pr.hbm_pressure_factor(ctx.hbm_pressure)
        self.c_h = phi / ref_gb * g
        self.sw = sw = pr.stall_weight
        self.in_hbm = in_hbm
        # what the holder says of its queues; "price" puts them into every cost, "timing" only
        # starts prefetches that much earlier, "off" ignores them
        queues = o.queues
        if queues is Queues.PRICE:
            self.lead = 0.0
            self.q_out = q_out = ctx.link_out_queue_s if in_hbm else 0.0
            self.q_in = q_in = ctx.link_in_queue_s
            self.q_nw, self.q_nr = q_nw, q_nr = ctx.nvme_write_queue_s, ctx.nvme_read_queue_s
            rho = min(max(ctx.link_utilisation, 0.0), MAX_RHO)
            self.lam = pr.link_weight * sw * rho / (1.0 - rho)
        else:
            self.lead = ctx.link_in_queue_s if queues is Queues.TIMING else 0.0
            self.q_out = q_out = self.q_in = q_in = self.q_nw = q_nw = self.q_nr = q_nr = self.lam = 0.0
        self.x_out = x_out = move / hw.link_d2h_bps if in_hbm else 0.0     # copy-out service time
        self.x_in = x_in = kv / hw.link_h2d_bps                           # reload service time
        self.t_out = q_out + x_out                                        # HBM held until the copy lands
        self.r_h = q_in + x_in                                            # reload, queue included
        self.t_rc = p.flops_per_token * ctx.context_tokens / hw.prefill_flops    # costmodel.t_recompute
        self.host_ok = not in_hbm or move <= ctx.host_free_bytes
        self.nvme_ok = o.nvme and move <= ctx.nvme_free_bytes
        # p.dram_price(ctx), and the price of holding the host copy (p.droppable_price where it is
        # droppable), the fill computed once
        fill = p.host_fill(ctx)
        self.dram = dram = pr.dram_factor(fill) / ref_gb
        # = dram unless the host copy is droppable
        self.hold = p.droppable_price(fill) if (ctx.write_through and o.cache_pricing) else dram
        self.nvme_rate = pr.nvme_ratio / ref_gb * gm
        self.t_w = q_nw + move / hw.nvme_write_bps
        self.t_rd = t_rd = q_nr + kv / hw.nvme_read_bps
        # chunked: NVMe -> host and host -> GPU overlap; the link's queue delays the chunks either way
        self.r_n = (t_rd if t_rd >= x_in else x_in) + q_in
        # the shadow price of the link time an offload and its reload take from others
        self.lc = self.lam * (x_out + x_in)
        # a revocable retention's priced chance of eviction before the return; the measured
        # eviction rate h and its chance 1 - E[exp(-h W)] before the pressure cap (None: pinned,
        # or no rate); set by _retain_cost
        self.evict_p = self.evict_h = self.evict_q = None


def decide_expected(p: PricedPolicy, ctx: PauseContext, dist: WaitDistribution, fc: WaitForecast | None,
                    from_tier: Action, elapsed: float, allow_retain: bool = True) -> Decision:
    """Minimise expected cost over ``dist`` from ``from_tier`` (RETAIN: the state is in HBM),
    ``elapsed`` seconds into the pause.  Returns times relative to the pause.  Pure.

    The hot path of every decide (bench_decide): plain locals, one pass, each offload priced
    exactly only when its lower bound can still win."""
    pr = p.prices
    t = _Terms(p, ctx, from_tier is Action.RETAIN)
    t.ew = ew = dist.mean
    known = fc is not None and fc.source == "known"
    sw, c_h, t_out = t.sw, t.c_h, t.t_out
    # Recompute takes the prefill engine for t_rc.  Past the admission ceiling the node is
    # saturated: its prefill is as scarce as its memory, so the compute price rises with the
    # same pressure factor as HBM.
    # While new work waits for admission the prefill engine is on its critical path: every second
    # of rebuild delays the queue behind it (``queued_compute_weight``).
    phi = t.phi
    cw = pr.queued_compute_weight if ctx.admission_waiting_bytes else pr.compute_weight
    best = c_rc = (sw + cw * (phi if phi > 1.0 else 1.0)) * t.t_rc
    costs: dict[str, float] = {"recompute": c_rc}
    name = "recompute"          # of equal costs the first in this order wins (min over the dict)
    lease_at = None
    if t.in_hbm and allow_retain:
        lease_at, c_ret = _retain_cost(p, ctx, dist, t, c_rc, known)
        costs["retain"] = c_ret
        if c_ret < best:
            best, name = c_ret, "retain"
    best_lb = best
    # Each offload costs lb + prefetch with 0 <= prefetch <= sw * r: price the prefetch
    # exactly only for offloads whose lower bound can still win.
    lb_h = lb_n = host_lease = None
    # A victim (allow_retain False: the holder must make room now) frees its HBM only when its
    # copy lands: after the copy-out to host, after the NVMe write too for NVMe.  The room is
    # wanted by work that waits meanwhile, so each of those seconds is a second of its stall
    # (option ``victim_free_weight`` stall weights; 0: the pause's own HBM price only).
    wanted = 0.0 if allow_retain else p.options.victim_free_weight * sw
    if t.host_ok:
        lb_h, host_lease = _host_hold_cost(p, ctx, dist, t, known)
        lb_h += wanted * t_out
        x = lb_h + sw * t.r_h
        if x < best_lb:
            best_lb = x
    if t.nvme_ok:
        # HBM is held until the NVMe write lands (the copy streams through bounce buffers), so
        # a queue on the NVMe write server is paid at the HBM price.  So is the write itself
        # when a pause chooses while the host tier holds a copy more cheaply than NVMe: NVMe
        # then offers no cheaper holding, and a host offload frees the HBM t_w sooner.  Past
        # that fill the host tier is the scarce one, and the write is paid at the DRAM price
        # (docs/policy.md, "Why it is this way").  A victim pays the same seconds as the
        # room's price (``wanted``).
        q_nw, q_nr = t.q_nw, t.q_nr
        if allow_retain and t.dram * t.gm < t.nvme_rate:
            held_w = c_h * (t_out + t.t_w)
        else:
            held_w = c_h * (t_out + q_nw) + t.dram * t.gm * (t.t_w - q_nw)
        lb_n = held_w + pr.io_weight * (t.t_w - q_nw + t.t_rd - q_nr) \
            + t.nvme_rate * ew + t.lc + wanted * (t_out + t.t_w)
        x = lb_n + sw * t.r_n
        if x < best_lb:
            best_lb = x
    # offload_host's prefetch is priced exactly only when the offload can win: best_prefetch
    # answers (None, inf) when it proves the prefetch costs more than what the offload must beat
    # (then its cost stays out of ``costs``, as for an offload whose lower bound lost).  An NVMe
    # offload priced at all is priced exactly (rarer; its cost is compared with host's).
    t_host = t_nvme = stage = None
    if lb_h is not None and lb_h <= best_lb:
        t_host, pf = best_prefetch(dist, t.r_h, c_h, sw, t_out, _beat(best, lb_h))
        if pf != _INF:
            costs["offload_host"] = c = lb_h + pf
            if c < best_lb:
                best_lb = c
            if c < best:
                best, name = c, "offload_host"
    if lb_n is not None and lb_n <= best_lb:
        t_nvme, pf = best_prefetch(dist, t.r_n, c_h, sw, t_out + t.t_w)
        costs["offload_nvme"] = c = lb_n + pf
        if c < best:
            best, name = c, "offload_nvme"
    action = _ACTIONS[name]
    if action is Action.OFFLOAD_NVME and p.options.staging:
        stage, t_nvme, c = _plan_staging(p, ctx, dist, t, t_nvme, costs["offload_nvme"] - lb_n)
        costs["offload_nvme"] = lb_n + c
    prefetch = t_host if action is Action.OFFLOAD_HOST else t_nvme if action is Action.OFFLOAD_NVME else None
    if prefetch is not None and t.lead > 0.0:
        # the reload will wait about ``lead`` behind others: start it that much earlier (not
        # before the copy-out, or the staging, has landed)
        floor = t_out + (t.t_w if action is Action.OFFLOAD_NVME else 0.0)
        if stage is not None:
            floor = stage + t.t_rd
        prefetch = max(floor, prefetch - t.lead)
    demote = _demote_at(p, fc, dist, action, prefetch, lease_at, host_lease, known)
    _expectation(costs, dist, t, action, prefetch, stage, demote)
    if elapsed:
        prefetch = None if prefetch is None else prefetch + elapsed
        demote = None if demote is None else demote + elapsed
        stage = None if stage is None else stage + elapsed
    return make_decision(action, prefetch, demote, costs[name], "min expected cost", costs, stage)


def _beat(best: float, lb: float) -> float:
    """What an offload's prefetch must cost less than for the offload (lower bound ``lb``
    without its prefetch) to beat ``best``, with a margin no rounding of ``lb + prefetch`` can
    cross."""
    return (best - lb) + 1e-9 * (abs(best) + abs(lb))


def _retain_cost(p: PricedPolicy, ctx: PauseContext, dist: WaitDistribution, t: _Terms,
                 recompute: float, known: bool) -> tuple[float | None, float]:
    """(lease, expected cost) of retaining.  With a priced lease L: hold HBM for min(W, L); if
    the tool outlives L, copy out then and reload on resume.  L ranges over the forecast's points
    (the last one = no lease), so heavy tails do not price retention at E[W]."""
    pr, hw, o = p.prices, p.hardware, p.options
    if o.lease is Lease.QUANTILE or known:
        return None, t.c_h * t.ew
    u, tau = ctx.hbm_pressure, pr.admission_ceiling
    if t.host_ok:
        leave = t.sw * t.r_h + t.lc
        tail_rate = t.hold * t.gm
    elif t.nvme_ok:
        leave = pr.io_weight * 2.0 * t.move / hw.nvme_write_bps + t.sw * t.r_n + t.lc
        tail_rate = t.nvme_rate
    else:
        leave, tail_rate = recompute, 0.0
    copy_out = t.t_out if (t.host_ok or t.nvme_ok) else 0.0
    lease_at, cost = best_lease(dist, t.c_h, t.c_h * copy_out + leave, tail_rate)
    if o.revocable and ctx.evictable \
            and (not ctx.admission_waiting_bytes or ctx.link_out_queue_s >= o.revocable_busy_s):
        # A retained pause is an eviction victim: when the room is wanted it leaves (copy-out at
        # the ceiling price, reload or rebuild later).  So the pressure part of the HBM price buys
        # one possible eviction (certain at and past the ceiling), not every second of the wait;
        # per second only ``revocable_floor`` is paid (default 0: room nobody wants costs
        # nothing, and whoever wants it takes it).  At any occupancy, but only while nothing
        # waits for admission or a copy-out started now would queue on the host link for
        # option ``revocable_busy_s`` or more
        # (then the waiting work gets the room no sooner from this copy-out than from a victim
        # evicted when the room is wanted: one FIFO link; and this pause may return first).
        c_tau = p.hbm_price(tau) * t.g
        press = (1.0 - pr.hbm_floor) * min(u / tau, 1.0) ** 3
        h = ctx.eviction_rate_per_s
        hz = None
        if h is not None:
            # The holder measures how often a retained pause is made to leave: the eviction
            # comes before the return with probability 1 - E[exp(-h W)] (victims taken at rate h),
            # which the pressure bounds from above.  A short wait below the ceiling is rarely
            # evicted, however full the pool: pricing it as a likely eviction would move it out at
            # the pause, and its reload would stall a return that retention does not.
            hz = 1.0 - float(np.dot(np.diff(dist.cum_w), np.exp(-h * dist.points)))
            press = min(press, hz)
        l2, c2 = best_lease(dist, pr.revocable_floor / p.ref_gb * t.g, t.c_h * copy_out + leave, tail_rate)
        c2 += press * (c_tau * copy_out + leave)
        if c2 < cost:
            lease_at, cost = l2, c2
            t.evict_p = press
            if hz is not None and h > 0.0:
                t.evict_h, t.evict_q = h, hz
    return lease_at, cost


def _host_hold_cost(p: PricedPolicy, ctx: PauseContext, dist: WaitDistribution, t: _Terms,
                    known: bool) -> tuple[float, float | None]:
    """(lower bound of offload_host's cost without its prefetch, priced lease to NVMe or None)."""
    pr, hw = p.prices, p.hardware
    base = t.c_h * t.t_out + t.lc
    hold_rate = t.hold * t.gm
    lb = base + hold_rate * t.ew
    if hold_rate * t.ew <= 0.0:
        return lb, None
    if ctx.write_through and p.options.cache_pricing:
        # A droppable copy is held only until the room is wanted; then the state reloads from
        # NVMe (the extra read, plus the disk's time) and lies there at the NVMe price.  Price
        # the hold as the best such drop time over the forecast.
        extra = t.sw * max(t.t_rd - t.r_h, 0.0) + pr.io_weight * t.kv / hw.nvme_read_bps
        return base + best_lease(dist, hold_rate, extra, t.nvme_rate)[1], None
    aw = ctx.admission_wait_s
    # (a lease to a tier no cheaper than DRAM never pays: every lease then costs at least the
    # plain hold, so the lease search is skipped)
    if aw is not None and aw < p.options.early_host_wait_s and not known and t.nvme_ok \
            and hold_rate > t.nvme_rate:
        # Host first, NVMe later: the early returns (the forecast's low quantiles) come back
        # from DRAM; at the lease L the copy moves on to NVMe (written then, read back or
        # staged before the return), so the tail pays the NVMe price, the disk's time and,
        # conservatively, the slower read.  Priced while new work's measured admission wait
        # is below option ``early_host_wait_s`` (a node that is not overloaded).
        after = pr.io_weight * (t.t_w + t.t_rd) + t.sw * max(t.t_rd - t.r_h, 0.0)
        lease, c = best_lease(dist, hold_rate, after, t.nvme_rate)
        if lease is not None and base + c < lb:
            return base + c, lease
    return lb, None


def _plan_staging(p: PricedPolicy, ctx: PauseContext, dist: WaitDistribution, t: _Terms,
                  t_nvme: float | None, pf: float) -> tuple[float | None, float | None, float]:
    """The NVMe copy's way back: staged NVMe -> host at s (host DRAM held from s at the DRAM
    price; a return before the staging lands pays the NVMe read), then host -> HBM at the
    prefetch (or on resume).  Returns (stage, prefetch, cost of the way back).

    While DRAM is plentiful (the tier's fill after staging below option ``early_stage_fill``) the
    staged copy pays only the fill term of the DRAM price: room nobody else wants is nearly
    free, so the copy comes up early and the forecast's early quantiles return from DRAM
    instead of paying the NVMe read (the p99 resume stall)."""
    if not (t.r_n > t.r_h and t.kv <= ctx.host_free_bytes):
        return None, t_nvme, pf
    t0 = t.t_out + t.t_w
    s, c_s = best_prefetch(dist, t.r_n - t.r_h, _staged_rate(p, ctx, t) * t.g, t.sw, t0)
    if s is None:
        return None, t_nvme, pf
    t_p, c_p = best_prefetch(dist, t.r_h, t.c_h, t.sw, s + t.t_rd)
    plist, cwl, _ = dist.lists
    early = cwl[bisect_left(plist, s + t.t_rd)] - cwl[bisect_left(plist, t0)]
    c_st = c_s + c_p + t.sw * t.r_h * early
    if c_st < pf:
        return s, t_p, c_st
    return None, t_nvme, pf


def _staged_rate(p: PricedPolicy, ctx: PauseContext, t: _Terms) -> float:
    """The price per GB-second of a copy staged NVMe -> host: the host hold price, or while
    DRAM is plentiful (option ``early_stage_fill``, see :func:`_plan_staging`) its fill term."""
    rate = t.hold
    hb = p.hardware.host_bytes
    early_fill = p.options.early_stage_fill
    if early_fill > 0.0 and hb > 0 and ctx.host_free_bytes < float("inf"):
        fill = 1.0 - (ctx.host_free_bytes - t.kv) / hb
        if fill < early_fill:
            pr = p.prices
            rate = min(rate, pr.dram_ratio * pr.dram_fill_slope * max(fill, 0.0) ** pr.dram_fill_power / p.ref_gb)
    return rate


def restage_time(p: PricedPolicy, ctx: PauseContext, dist: WaitDistribution) -> float | None:
    """Whether to stage NVMe -> host now a paused copy that is not in HBM (an engine's pause,
    whose host copy the store pushed down to NVMe): 0.0 (now) when the stall weight x
    E[stall] of a staging started now plus the staged copy's DRAM hold until the return,
    over ``dist`` (the wait remaining from now), costs less than reading it from NVMe at
    the resume; None: leave it on NVMe, also when an NVMe read is no slower than a host
    one.  Pure."""
    t = _Terms(p, ctx, False)
    r = t.r_n - t.r_h
    if not r > 0.0:
        return None
    now = t.sw * expected_stall(dist, 0.0, r) + _staged_rate(p, ctx, t) * t.g * dist.mean
    return 0.0 if now < t.sw * r else None


def _demote_at(p: PricedPolicy, fc: WaitForecast | None, dist: WaitDistribution, action: Action,
               prefetch: float | None, lease_at: float | None, host_lease: float | None,
               known: bool) -> float | None:
    o = p.options
    if action is Action.RETAIN and o.lease is Lease.PRICED:
        return lease_at
    if action is Action.OFFLOAD_HOST and host_lease is not None:
        return host_lease if prefetch is None or host_lease < prefetch else None
    if (action is Action.RETAIN or action is Action.OFFLOAD_HOST) and not known:
        if fc is None:
            lease = dist.quantile(o.lease_quantile)
        else:
            lease = fc.quantiles.get(o.lease_key) or fc.quantile(o.lease_quantile)
        if prefetch is None or lease < prefetch:
            return lease
    return None


def _expectation(out: dict, dist: WaitDistribution, t: _Terms, action: Action, prefetch: float | None,
                 stage: float | None, demote: float | None) -> None:
    """Put into ``out`` what the chosen action expects to happen, term by term (see the module
    docstring)."""
    hold = xfer = link_q = nvme_q = stall = rc = 0.0
    if action is Action.RECOMPUTE:
        rc = t.t_rc
    elif action is Action.RETAIN:
        plist, cwl, cml = dist.lists
        if demote is None:
            surv, held = 0.0, t.ew
        else:
            i = bisect_left(plist, demote)
            surv = 1.0 - cwl[i]
            held = cml[i] + demote * surv
        leave = surv
        p_ev = t.evict_p
        if p_ev:
            # priced as revocable: evicted before the return with chance p_ev (then copied out,
            # and reloaded on the return), else held to the lease as a pinned retention
            leave = p_ev + (1.0 - p_ev) * surv
            h = t.evict_h
            if h is not None:
                # held until min(W, lease, eviction), eviction at rate h: E[(1 - e^(-h min(W, L))) / h];
                # without a lease that is the chance _retain_cost priced, over h
                if demote is None:
                    held = t.evict_q / h
                else:
                    held = float(np.dot(np.diff(dist.cum_w), -np.expm1(-h * np.minimum(dist.points, demote)))) / h
        hold = t.g * (held + leave * t.t_out)
        if leave:
            xfer, link_q, stall = leave * (t.x_out + t.x_in), leave * (t.q_out + t.q_in + t.lead), leave * t.r_h
    else:
        nvme = action is Action.OFFLOAD_NVME
        t_min = t.t_out + (t.t_w if nvme else 0.0)
        r = t.r_n if nvme and stage is None else t.r_h
        hold = t.g * t_min
        if prefetch is None:
            stall = expected_stall(dist, prefetch, r, t_min)
        else:
            plist, cwl, cml = dist.lists
            i = bisect_left(plist, prefetch)
            p0, m0 = cwl[i], cml[i]
            hold += t.g * ((cml[-1] - m0) - prefetch * (1.0 - p0))
            # expected_stall(dist, prefetch, r, t_min), its first bisect shared with the hold's
            p_min = cwl[bisect_left(plist, t_min)] if t_min > 0.0 else 0.0
            i1 = bisect_left(plist, prefetch + r)
            stall = r * max(p0 - p_min, 0.0) + (prefetch + r) * (cwl[i1] - p0) - (cml[i1] - m0)
        xfer = t.x_out + t.x_in
        link_q = t.q_out + t.q_in + t.lead      # the queue waits the decision accounted for
        if nvme:
            xfer += (t.t_w - t.q_nw) + (t.t_rd - t.q_nr)
            nvme_q = t.q_nw + t.q_nr
    out["exp_hold_gbs"] = hold
    out["exp_transfer_s"] = xfer
    out["exp_link_queue_s"] = link_q
    out["exp_nvme_queue_s"] = nvme_q
    out["exp_stall_s"] = stall
    out["exp_recompute_s"] = rc
