"""The service's state: predictor, policies, and the paused-trajectory registry,
persisted in LMDB under the data directory.

On-disk layout (one LMDB environment, ``<data_dir>/service.lmdb/``)::

    main  b"pred/..."            -> the predictor's own records
                                    (``ToolWaitPredictor.open(env)``: learned
                                    state survives a restart exactly)
    meta  b"schema"              -> b"1"
          b"boot"                -> decimal start counter
    traj  trajectory id          -> crc32(4B, BE) + JSON record (paused ones)
    lost  trajectory id          -> JSON {"tool", "reason", "paused_at"}

Ordering: every mutation commits its LMDB transaction before the in-memory
view changes, so a failed write leaves both untouched.  Writes use
``sync=False``: a committed write survives a process crash (it is in the
kernel's page cache), ``close()`` flushes; ``durable=True`` fsyncs each commit.

Across a restart a paused trajectory is *restored* (its pause time is wall
clock, so the wait measured at resume still counts the downtime) unless it was
paused longer than ``lost_after_s`` ago or its record fails its checksum; then
it is moved to ``lost`` and a resume answers 410 with the reason.  The service
holds metadata only, never KV bytes: "restored" means the service still knows
the pause, its decision and its forecast.

Thread safety: one ``threading.Lock`` guards the LMDB writes, the predictor,
the policy cache and the in-memory registry; every public method takes it with
``with``.  The metrics object locks internally.
"""
from __future__ import annotations

import fcntl
import json
import math
import os
import struct
import threading
import time
import zlib
from collections import OrderedDict
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol

import lmdb

from kvtier.tiering.model.costmodel import HardwareProfile, ModelGeometry
from kvtier.tiering.model.decision import Action, Decision, Forecast, PauseContext, Policy
from kvtier.tiering.forecasting.forecast import Predictor
from kvtier.tiering.model.tiers import Tier

from .metrics import TIER_LABELS, ServiceMetrics
from .security import confined_path

SCHEMA = b"1"


# ----------------------------------------------------------------------------- errors
class ServiceError(Exception):
    """A request the state refuses; ``status`` is the HTTP status to answer."""
    status = 400


class NotFound(ServiceError):
    status = 404


class Conflict(ServiceError):
    status = 409


class Gone(ServiceError):
    status = 410


class Unprocessable(ServiceError):
    status = 422


class TooMany(ServiceError):
    status = 429


# ----------------------------------------------------------------------------- config
def default_hardware() -> HardwareProfile:
    """The node assumed when a request names none: ``kvtier.tiering.model.presets.DEFAULT_NODE``."""
    from kvtier.tiering.model.presets import DEFAULT_NODE, get_node
    return get_node(DEFAULT_NODE)


@dataclass(frozen=True)
class StateConfig:
    """How the state is kept.  ``data_dir`` must already be validated (see
    :func:`kvtier.tiering.service.security.check_data_dir`)."""

    data_dir: Path
    policy: str = "breakeven"
    hardware: HardwareProfile = field(default_factory=default_hardware)
    lost_after_s: float = 7 * 24 * 3600.0   # paused longer than this before a restart -> lost
    max_tools: int = 4096                   # distinct tool names kept; the least recently seen fold into the prior
    max_paused: int = 1_000_000             # trajectories paused at once
    max_lost: int = 10_000                  # lost records kept for reporting
    policy_cache: int = 64                  # (policy, geometry, hardware) instances kept
    durable: bool = False                   # fsync every commit
    map_size: int = 256 * 2**20             # initial LMDB map; doubled when full

    def __post_init__(self) -> None:
        if not (self.lost_after_s >= 0 and math.isfinite(self.lost_after_s)):
            raise ValueError("lost_after_s must be a finite number >= 0")
        for f in ("max_tools", "max_paused", "max_lost", "policy_cache"):
            if getattr(self, f) < 1:
                raise ValueError(f"{f} must be >= 1")


# ----------------------------------------------------------------------------- records
@dataclass(frozen=True)
class TrajectoryRecord:
    """A paused trajectory as the service remembers it."""

    trajectory_id: str
    tool: str
    paused_at: float                     # wall clock (time.time())
    boot: int                            # service start that recorded the pause
    action: str | None = None            # decided action, if a decision was made
    kv_bytes: int = 0
    moved_bytes: int = 0
    policy: str | None = None
    forecast_p10: float | None = None
    forecast_p50: float | None = None
    forecast_p90: float | None = None
    features: Mapping[str, str] | None = None
    prefetch_at_s: float | None = None
    demote_at_s: float | None = None
    inputs: Mapping[str, Any] | None = None  # the decision's inputs (JSON), to re-decide at lease expiry

    @property
    def tier(self) -> Tier | None:
        """The action's tier (:attr:`Action.tier`; None: nowhere).  Its label in the metrics
        and stats is :data:`~.metrics.TIER_LABELS`'s."""
        return None if self.action is None else Action(self.action).tier

    def encode(self) -> bytes:
        body = json.dumps(asdict(self), separators=(",", ":"), sort_keys=True).encode()
        return struct.pack(">I", zlib.crc32(body)) + body

    @classmethod
    def decode(cls, raw: bytes) -> "TrajectoryRecord":
        """Raises ValueError on a checksum mismatch or a malformed record."""
        if len(raw) < 5:
            raise ValueError("record too short")
        (crc,), body = struct.unpack(">I", raw[:4]), raw[4:]
        if zlib.crc32(body) != crc:
            raise ValueError("record checksum mismatch")
        try:
            d = json.loads(body)
            return cls(**d)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"malformed record: {exc}") from None


@dataclass(frozen=True)
class DecisionResult:
    decision: Decision
    kv_bytes: int
    moved_bytes: int
    policy: str
    forecast: Forecast | None
    prefetch_reason: str | None = None   # why there is no prefetch time (None: there is one, or no reload)


USEFUL_PREFETCH_QUANTILE = "p99"


def useful_prefetch(decision: Decision, forecast: Forecast | None) -> tuple[Decision, str | None]:
    """The decision as the service answers it: a prefetch time past the forecast's p99 is dropped.

    A policy that optimises the expected cost may return a prefetch "just in time for" a far tail
    point (say 2,000 s for a tool whose p99 is 1,100 s): more than 99% of the time the tool is back
    before it, so that time tells a holder nothing.  Such a decision is answered with
    ``prefetch_at_s`` None ("reload when the tool returns") and the reason; its expected cost is
    the policy's (the two differ by less than 1% of the stall).  Returns (decision, reason), the
    reason None when the decision keeps its prefetch or has nothing to reload.  Pure.
    """
    if Action(decision.action) not in (Action.OFFLOAD_HOST, Action.OFFLOAD_NVME):
        return decision, None
    t = decision.prefetch_at_s
    if t is None or not math.isfinite(t):
        return replace(decision, prefetch_at_s=None), \
            "reload when the tool returns: no prefetch time is worth holding the reloaded state for"
    p99 = None if forecast is None else forecast.quantiles.get(USEFUL_PREFETCH_QUANTILE)
    if p99 is not None and math.isfinite(p99) and t > p99:
        return replace(decision, prefetch_at_s=None), \
            (f"reload when the tool returns: the best prefetch time ({t:.3g} s) is past the forecast's "
             f"{USEFUL_PREFETCH_QUANTILE} ({p99:.3g} s), so it would almost never land before the return")
    return decision, None


@dataclass(frozen=True)
class PauseResult:
    record: TrajectoryRecord
    decision: DecisionResult | None


@dataclass(frozen=True)
class ResumeResult:
    record: TrajectoryRecord
    wait_s: float
    restored: bool


@dataclass(frozen=True)
class LeaseResult:
    record: TrajectoryRecord        # the record after the re-decision
    decision: Decision | None       # None: the policy keeps the placement (or cannot demote further)
    changed: bool                   # the placement changed (e.g. host -> NVMe)
    elapsed_s: float


@dataclass(frozen=True)
class DecideRequest:
    """A pause to price (plain data; the HTTP layer builds it from JSON)."""

    tool: str
    context_tokens: int
    model: str | ModelGeometry
    stored_tokens: int = 0
    hbm_pressure: float = 0.0
    host_free_bytes: float = math.inf
    nvme_free_bytes: float = math.inf
    hardware: str | HardwareProfile | None = None   # node preset name or a profile
    policy: str | None = None
    features: Mapping[str, str] | None = None
    trajectory_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The inputs as plain JSON (kept with a paused trajectory)."""
        def fin(x: float) -> float | None:
            return None if math.isinf(x) else x
        return {"context_tokens": self.context_tokens, "stored_tokens": self.stored_tokens,
                "model": self.model if isinstance(self.model, str) else asdict(self.model),
                "hardware": self.hardware if not isinstance(self.hardware, HardwareProfile)
                else asdict(self.hardware),
                "hbm_pressure": self.hbm_pressure, "host_free_bytes": fin(self.host_free_bytes),
                "nvme_free_bytes": fin(self.nvme_free_bytes), "policy": self.policy}

    @classmethod
    def from_json(cls, tool: str, d: Mapping[str, Any], features: Mapping[str, str] | None = None,
                  trajectory_id: str | None = None) -> "DecideRequest":
        """Inverse of :meth:`to_json`.  Raises ValueError/TypeError on a malformed mapping."""
        model = d["model"] if isinstance(d["model"], str) else ModelGeometry(**d["model"])
        hw = d.get("hardware")
        if isinstance(hw, Mapping):
            hw = HardwareProfile(**hw)
        return cls(tool=tool, context_tokens=int(d["context_tokens"]), model=model,
                   stored_tokens=int(d.get("stored_tokens", 0)), hbm_pressure=float(d.get("hbm_pressure", 0.0)),
                   host_free_bytes=math.inf if d.get("host_free_bytes") is None else float(d["host_free_bytes"]),
                   nvme_free_bytes=math.inf if d.get("nvme_free_bytes") is None else float(d["nvme_free_bytes"]),
                   hardware=hw, policy=d.get("policy"), features=features, trajectory_id=trajectory_id)


# ----------------------------------------------------------------------------- factories
class ServicePredictor(Predictor, Protocol):
    """What the service needs of its predictor besides ``observe`` and ``forecast``
    (:class:`~kvtier.tiering.forecasting.predictor.ToolWaitPredictor` is one).  Thread-safe."""

    def tools(self) -> Mapping[str, int]:
        """The tools learned and their observation counts."""
        ...

    def forget(self, tool: str) -> bool:
        """Fold ``tool``'s own state into its class prior; False if it had none."""
        ...

    @property
    def n_observations(self) -> int:
        """Observations learned, over every boot."""
        ...


PredictorFactory = Callable[[lmdb.Environment], ServicePredictor]   # gets the service's env to persist in
PolicyFactory = Callable[[str, ModelGeometry, HardwareProfile, Any], Policy]
ModelResolver = Callable[[str], ModelGeometry]


def _real_predictor(env: lmdb.Environment) -> ServicePredictor:
    from kvtier.tiering.forecasting.predictor import ToolWaitPredictor
    return ToolWaitPredictor.open(env)


def _real_policy(name: str, geometry: ModelGeometry, hardware: HardwareProfile, predictor: Any) -> Policy:
    from kvtier.tiering.policy.policies import make_policy
    return make_policy(name, geometry=geometry, hardware=hardware, predictor=predictor)


def _real_model(name: str) -> ModelGeometry:
    from kvtier.tiering.model.presets import get_preset
    return get_preset(name)


def _real_node(name: str) -> HardwareProfile:
    from kvtier.tiering.model.presets import get_node
    return get_node(name)


# ----------------------------------------------------------------------------- state
class ServiceState:
    """Predictor + policies + trajectory registry, persisted under ``data_dir``.

    Use as a context manager or call :meth:`close`.  Every public method is
    thread-safe.  Methods raise :class:`ServiceError` subclasses for requests
    they refuse; a refused request changes nothing (neither LMDB nor memory).
    """

    def __init__(self, config: StateConfig, *, metrics: ServiceMetrics | None = None,
                 predictor_factory: PredictorFactory = _real_predictor,
                 policy_factory: PolicyFactory = _real_policy,
                 model_resolver: ModelResolver = _real_model,
                 clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.metrics = metrics or ServiceMetrics()
        self._policy_factory = policy_factory
        self._model_resolver = model_resolver
        self._clock = clock
        self._lock = threading.Lock()
        self._started = time.monotonic()
        self._policies: OrderedDict[tuple, Policy] = OrderedDict()
        self._paused: dict[str, TrajectoryRecord] = {}
        self._decisions = {a.value: 0 for a in Action}
        self._restored = 0
        self._lost_now = 0
        self._closed = False

        # One service per data dir: two would each trust their in-memory view.
        self._lock_fd = _lock_data_dir(config.data_dir)
        self._env: lmdb.Environment | None = None
        try:
            self._open(config, predictor_factory)
        except BaseException:
            # A failed start (bad schema, unreadable LMDB, a predictor that cannot load) must not
            # keep the flock or the environment: a retry in this process would say "in use".
            self._release()
            raise

    # ------------------------------------------------------------------ start-up
    def _open(self, config: StateConfig, predictor_factory: PredictorFactory) -> None:
        path = confined_path(config.data_dir, "service.lmdb")
        path.mkdir(parents=True, exist_ok=True)
        self._env = lmdb.open(str(path), max_dbs=8, map_size=config.map_size, subdir=True,
                              sync=config.durable, metasync=config.durable, lock=True)
        self._db_meta = self._env.open_db(b"meta")
        self._db_traj = self._env.open_db(b"traj")
        self._db_lost = self._env.open_db(b"lost")

        self.predictor = predictor_factory(self._env)
        # tool names learned, least recently seen first; past max_tools the oldest is folded
        self._tools: OrderedDict[str, None] = OrderedDict.fromkeys(self.predictor.tools())
        self._tools_folded = 0
        self._boot_up()

    def _release(self) -> None:
        """Close the environment (if open) and release the flock; each at most once."""
        self._closed = True
        env, self._env = self._env, None
        try:
            if env is not None:
                env.close()
        finally:
            fd, self._lock_fd = self._lock_fd, -1
            if fd >= 0:
                os.close(fd)   # releases the flock

    def _boot_up(self) -> None:
        with self._env.begin(write=True) as txn:
            schema = txn.get(b"schema", db=self._db_meta)
            if schema is None:
                txn.put(b"schema", SCHEMA, db=self._db_meta)
            elif schema != SCHEMA:
                raise ValueError(f"data dir holds service schema {schema!r}, this build reads {SCHEMA!r}")
            self.boot = int(txn.get(b"boot", b"0", db=self._db_meta)) + 1
            txn.put(b"boot", str(self.boot).encode(), db=self._db_meta)
        self._recover_trajectories()

    def _recover_trajectories(self) -> None:
        now = self._clock()
        keep: dict[str, TrajectoryRecord] = {}
        lost: list[tuple[bytes, dict]] = []
        with self._env.begin(db=self._db_traj) as txn:
            for key, val in txn.cursor():
                tid = key.decode(errors="replace")
                try:
                    rec = TrajectoryRecord.decode(val)
                except ValueError as exc:
                    lost.append((key, {"tool": None, "reason": f"record unreadable after restart ({exc})",
                                       "paused_at": None}))
                    continue
                age = now - rec.paused_at
                if age > self.config.lost_after_s:
                    lost.append((key, {"tool": rec.tool, "paused_at": rec.paused_at,
                                       "reason": f"paused {age:.0f} s before restart, longer than "
                                                 f"lost_after_s={self.config.lost_after_s:g}"}))
                else:
                    keep[tid] = rec
        if lost:
            with self._env.begin(write=True) as txn:
                for key, info in lost:
                    txn.delete(key, db=self._db_traj)
                    txn.put(key, json.dumps(info).encode(), db=self._db_lost)
                self._trim_lost(txn)
        self._paused = keep
        self._restored = sum(1 for r in keep.values() if r.boot < self.boot)
        self._lost_now = len(lost)
        self.metrics.restored.inc(self._restored)
        self.metrics.lost.inc(self._lost_now)
        self._refresh_occupancy()

    def _trim_lost(self, txn: lmdb.Transaction) -> None:
        n = txn.stat(self._db_lost)["entries"]
        if n <= self.config.max_lost:
            return
        cur = txn.cursor(db=self._db_lost)
        cur.first()
        for _ in range(n - self.config.max_lost):
            cur.delete()

    # ------------------------------------------------------------------ helpers
    def _write(self, fn: Callable[[lmdb.Transaction], None]) -> None:
        """Run ``fn`` in one write transaction, growing the map if it fills."""
        for _ in range(8):
            try:
                with self._env.begin(write=True) as txn:
                    fn(txn)
                return
            except lmdb.MapFullError:
                self._env.set_mapsize(self._env.info()["map_size"] * 2)
        raise ServiceError("state store is full")  # pragma: no cover

    def _refresh_occupancy(self) -> None:
        """Recount occupancy from the registry (start-up only: O(paused))."""
        self._occ: dict[Tier, list[int]] = {t: [0, 0] for t in TIER_LABELS}
        for r in self._paused.values():
            self._occupy(r, +1, publish=False)
        self._publish_occupancy()

    def _occupy(self, r: TrajectoryRecord, sign: int, *, publish: bool = True) -> None:
        """Add (+1) or remove (-1) one paused trajectory from the tier counts: O(1)."""
        t = r.tier
        if t is not None:
            self._occ[t][0] += sign
            self._occ[t][1] += sign * r.kv_bytes
        if publish:
            self._publish_occupancy()

    def _publish_occupancy(self) -> None:
        for t, (n, b) in self._occ.items():
            self.metrics.occupancy_trajectories.labels(tier=TIER_LABELS[t]).set(n)
            self.metrics.occupancy_bytes.labels(tier=TIER_LABELS[t]).set(b)
        self.metrics.paused.set(len(self._paused))

    def _policy(self, name: str, geometry: ModelGeometry, hardware: HardwareProfile) -> Policy:
        key = (name, geometry, hardware)
        pol = self._policies.get(key)
        if pol is None:
            try:
                pol = self._policy_factory(name, geometry, hardware, self.predictor)
            except (KeyError, ValueError) as exc:
                raise Unprocessable(_one_line(exc)) from None
            self._policies[key] = pol
            if len(self._policies) > self.config.policy_cache:
                self._policies.popitem(last=False)
        else:
            self._policies.move_to_end(key)
        return pol

    def _geometry(self, model: str | ModelGeometry) -> ModelGeometry:
        if isinstance(model, ModelGeometry):
            return model
        try:
            return self._model_resolver(model)
        except (KeyError, ValueError) as exc:
            raise Unprocessable(_one_line(exc)) from None

    def _hardware(self, hw: str | HardwareProfile | None) -> HardwareProfile:
        if hw is None:
            return self.config.hardware
        if isinstance(hw, HardwareProfile):
            return hw
        try:
            return _real_node(hw)
        except (KeyError, ValueError) as exc:
            raise Unprocessable(_one_line(exc)) from None

    def _context(self, req: DecideRequest, geometry: ModelGeometry) -> PauseContext:
        kv = geometry.kv_bytes(req.context_tokens)
        stored = geometry.kv_bytes(min(req.stored_tokens, req.context_tokens))
        try:
            return PauseContext(tool=req.tool, kv_bytes=kv, context_tokens=req.context_tokens,
                                new_bytes=kv - stored, hbm_pressure=req.hbm_pressure,
                                host_free_bytes=req.host_free_bytes, nvme_free_bytes=req.nvme_free_bytes,
                                now_s=self._clock(), features=dict(req.features) if req.features else None,
                                trajectory_id=req.trajectory_id)
        except ValueError as exc:
            raise Unprocessable(_one_line(exc)) from None

    def _check_open(self) -> None:
        if self._closed:
            raise ServiceError("service state is closed")

    # ------------------------------------------------------------------ predictor
    def observe(self, tool: str, wait_s: float, features: Mapping[str, str] | None = None) -> int:
        """Learn one tool duration (persisted by the predictor); return the
        tool's observation count as its forecast reports it.

        Raises: Unprocessable (bad wait, tool name or features; nothing
        learned).  A new tool beyond ``max_tools`` folds the least recently
        seen one into its class prior (counted in ``stats()["tools_folded"]``).
        """
        with self._lock:
            self._check_open()
            self._observe_locked(tool, wait_s, features)
            return int(self.predictor.forecast(tool).n)

    def _observe_locked(self, tool: str, wait_s: float, features: Mapping[str, str] | None) -> None:
        if not (isinstance(wait_s, (int, float)) and math.isfinite(wait_s) and wait_s >= 0):
            raise Unprocessable(f"wait_s must be a finite number >= 0, got {wait_s!r}")
        try:
            self.predictor.observe(tool, float(wait_s), dict(features) if features else None)
        except ValueError as exc:
            raise Unprocessable(_one_line(exc)) from None
        self._seen_tool(tool)
        self.metrics.observations.inc()

    def _seen_tool(self, tool: str) -> None:
        """``tool`` is the most recently seen; past ``max_tools`` the least
        recently seen is folded into its class prior, as the predictor folds
        its nodes past ``max_nodes`` (lock held)."""
        tools = self._tools
        if tool in tools:
            tools.move_to_end(tool)
            return
        tools[tool] = None
        while len(tools) > self.config.max_tools:
            old, _ = tools.popitem(last=False)
            self.predictor.forget(old)
            self._tools_folded += 1

    def forecast(self, tool: str, features: Mapping[str, str] | None = None) -> Forecast:
        """The predictor's forecast for ``tool`` (a prior for an unseen tool)."""
        with self._lock:
            self._check_open()
            try:
                return self.predictor.forecast(tool, dict(features) if features else None)
            except ValueError as exc:
                raise Unprocessable(_one_line(exc)) from None

    # ------------------------------------------------------------------ decisions
    def decide(self, req: DecideRequest) -> DecisionResult:
        """Price one pause.  Mutates nothing but the decision counters.

        Raises: Unprocessable (unknown model preset or policy, inconsistent sizes).
        """
        with self._lock:
            self._check_open()
            return self._decide_locked(req)

    def _decide_locked(self, req: DecideRequest) -> DecisionResult:
        geometry = self._geometry(req.model)
        hardware = self._hardware(req.hardware)
        name = req.policy or self.config.policy
        policy = self._policy(name, geometry, hardware)
        ctx = self._context(req, geometry)
        kv = ctx.kv_bytes
        try:
            decision = policy.decide(ctx)
        except (ValueError, ArithmeticError) as exc:
            # ArithmeticError: a pause the policy cannot price (extreme but
            # schema-valid numbers); refused, not a server error.
            raise Unprocessable(f"cannot price this pause: {_one_line(exc)}") from None
        try:
            fc = self.predictor.forecast(req.tool, ctx.features)
        except ValueError as exc:
            raise Unprocessable(_one_line(exc)) from None
        decision, why = useful_prefetch(decision, fc)
        action = Action(decision.action)
        self._decisions[action.value] += 1
        self.metrics.decisions.labels(action=action.value).inc()
        return DecisionResult(decision=decision, kv_bytes=kv, moved_bytes=ctx.bytes_to_move,
                              policy=policy.name, forecast=fc, prefetch_reason=why)

    # ------------------------------------------------------------------ trajectories
    def pause(self, trajectory_id: str, tool: str, decide: DecideRequest | None = None,
              features: Mapping[str, str] | None = None) -> PauseResult:
        """Register a pause (and decide, if ``decide`` is given).

        Raises: Conflict (already paused), Gone (id reported lost, not yet
        acknowledged by a resume), TooMany, Unprocessable.
        """
        with self._lock:
            self._check_open()
            if trajectory_id in self._paused:
                raise Conflict(f"trajectory {trajectory_id!r} is already paused")
            if len(self._paused) >= self.config.max_paused:
                raise TooMany(f"already {self.config.max_paused} paused trajectories")
            result = None
            if decide is not None:
                result = self._decide_locked(replace(decide, trajectory_id=trajectory_id))
            fc = result.forecast if result is not None else None
            if fc is None:
                try:  # also validates the name and features before anything is stored
                    fc = self.predictor.forecast(tool, dict(features) if features else None)
                except ValueError as exc:
                    raise Unprocessable(_one_line(exc)) from None
            q = fc.quantiles if fc is not None else {}
            rec = TrajectoryRecord(
                trajectory_id=trajectory_id, tool=tool, paused_at=self._clock(), boot=self.boot,
                action=None if result is None else Action(result.decision.action).value,
                kv_bytes=0 if result is None else result.kv_bytes,
                moved_bytes=0 if result is None else result.moved_bytes,
                policy=None if result is None else result.policy,
                forecast_p10=q.get("p10"), forecast_p50=q.get("p50"), forecast_p90=q.get("p90"),
                features=dict(features) if features else None,
                prefetch_at_s=None if result is None else _finite(result.decision.prefetch_at_s),
                demote_at_s=None if result is None else _finite(result.decision.demote_at_s),
                inputs=None if decide is None else decide.to_json())
            key = trajectory_id.encode()

            def fn(txn: lmdb.Transaction) -> None:
                txn.put(key, rec.encode(), db=self._db_traj)
                txn.delete(key, db=self._db_lost)  # a reused id supersedes an old loss report

            self._write(fn)
            self._paused[trajectory_id] = rec
            if rec.tier in (Tier.HOST, Tier.NVME):
                self.metrics.bytes_moved.labels(tier=TIER_LABELS[rec.tier], direction="out").inc(rec.moved_bytes)
            self._occupy(rec, +1)
            return PauseResult(record=rec, decision=result)

    def resume(self, trajectory_id: str, wait_s: float | None = None,
               stall_s: float | None = None) -> ResumeResult:
        """The tool returned: record the wait, feed the predictor, forget the pause.

        ``wait_s`` overrides the wall-clock wait since the pause.
        Raises: NotFound (never paused), Gone (lost across a restart; the loss
        report is consumed), Unprocessable (bad numbers).
        """
        for name, v in (("wait_s", wait_s), ("stall_s", stall_s)):
            if v is not None and not (math.isfinite(v) and v >= 0):
                raise Unprocessable(f"{name} must be a finite number >= 0, got {v!r}")
        key = trajectory_id.encode()
        with self._lock:
            self._check_open()
            rec = self._paused.get(trajectory_id)
            if rec is None:
                with self._env.begin(db=self._db_lost) as txn:
                    raw = txn.get(key)
                if raw is None:
                    raise NotFound(f"trajectory {trajectory_id!r} is not paused")
                self._write(lambda txn: txn.delete(key, db=self._db_lost))
                info = json.loads(raw)
                raise Gone(f"trajectory {trajectory_id!r} was lost across a service restart: {info['reason']}")
            wait = wait_s if wait_s is not None else max(0.0, self._clock() - rec.paused_at)
            # Forget the pause first, then learn: a crash in between loses one
            # duration (a miss), never counts a wait twice.
            self._write(lambda txn: txn.delete(key, db=self._db_traj))
            del self._paused[trajectory_id]
            self._occupy(rec, -1)
            try:
                self._observe_locked(rec.tool, wait, rec.features)
            except ServiceError:  # pragma: no cover - name and features were validated at pause
                pass
            m = self.metrics
            if rec.forecast_p50 is not None:
                m.forecast_checked.inc()
                m.forecast_log_error.observe(abs(math.log(max(wait, 1e-6) / max(rec.forecast_p50, 1e-6))))
                if rec.forecast_p10 is not None and rec.forecast_p90 is not None \
                        and rec.forecast_p10 <= wait <= rec.forecast_p90:
                    m.forecast_in_p10_p90.inc()
            if rec.tier in (Tier.HOST, Tier.NVME):
                m.bytes_moved.labels(tier=TIER_LABELS[rec.tier], direction="in").inc(rec.kv_bytes)
            if stall_s is not None:
                m.resume_stall.observe(stall_s)
            return ResumeResult(record=rec, wait_s=wait, restored=rec.boot < self.boot)

    def lease_expired(self, trajectory_id: str, elapsed_s: float | None = None) -> LeaseResult:
        """The decision's lease (``demote_at_s``) ran out with the tool still
        running: ask the policy again with the wait conditioned on having
        lasted ``elapsed_s`` (default: wall clock since the pause), from the
        current placement.  A changed placement (HBM -> host, host -> NVMe) is
        recorded: occupancy and bytes moved follow it.

        Raises: NotFound (not paused), Unprocessable (paused without a
        decision, or bad elapsed_s).
        """
        if elapsed_s is not None and not (math.isfinite(elapsed_s) and elapsed_s >= 0):
            raise Unprocessable(f"elapsed_s must be a finite number >= 0, got {elapsed_s!r}")
        with self._lock:
            self._check_open()
            rec = self._paused.get(trajectory_id)
            if rec is None:
                raise NotFound(f"trajectory {trajectory_id!r} is not paused")
            if rec.action is None or rec.inputs is None:
                raise Unprocessable(f"trajectory {trajectory_id!r} was paused without a decision; "
                                    "nothing to re-decide")
            elapsed = elapsed_s if elapsed_s is not None else max(0.0, self._clock() - rec.paused_at)
            try:
                req = DecideRequest.from_json(rec.tool, rec.inputs, rec.features, trajectory_id)
            except (KeyError, TypeError, ValueError) as exc:
                raise Unprocessable(f"stored decision inputs unreadable: {_one_line(exc)}") from None
            geometry = self._geometry(req.model)
            policy = self._policy(req.policy or self.config.policy, geometry, self._hardware(req.hardware))
            ctx = self._context(req, geometry)
            current = Decision(action=Action(rec.action), prefetch_at_s=rec.prefetch_at_s,
                               demote_at_s=rec.demote_at_s)
            try:
                new = policy.on_lease_expiry(ctx, elapsed, current)
            except (ValueError, ArithmeticError) as exc:
                raise Unprocessable(f"cannot re-price this pause: {_one_line(exc)}") from None
            if new is None:
                return LeaseResult(record=rec, decision=None, changed=False, elapsed_s=elapsed)
            action = Action(new.action)
            changed = action.value != rec.action
            upd = replace(rec, action=action.value, prefetch_at_s=_finite(new.prefetch_at_s),
                          demote_at_s=_finite(new.demote_at_s),
                          moved_bytes=rec.kv_bytes if changed else rec.moved_bytes)
            self._write(lambda txn: txn.put(trajectory_id.encode(), upd.encode(), db=self._db_traj))
            self._paused[trajectory_id] = upd
            if changed:
                self._occupy(rec, -1, publish=False)
                self._occupy(upd, +1)
                self._decisions[action.value] += 1
                self.metrics.decisions.labels(action=action.value).inc()
                if upd.tier in (Tier.HOST, Tier.NVME):
                    self.metrics.bytes_moved.labels(tier=TIER_LABELS[upd.tier], direction="out").inc(upd.kv_bytes)
            return LeaseResult(record=upd, decision=new, changed=changed, elapsed_s=elapsed)

    def paused(self, trajectory_id: str) -> TrajectoryRecord | None:
        with self._lock:
            return self._paused.get(trajectory_id)

    def lost(self) -> dict[str, dict]:
        """Loss reports not yet consumed by a resume: id -> {"tool", "reason", "paused_at"}."""
        with self._lock, self._env.begin(db=self._db_lost) as txn:
            return {k.decode(errors="replace"): json.loads(v) for k, v in txn.cursor()}

    # ------------------------------------------------------------------ stats
    def stats(self) -> dict[str, Any]:
        with self._lock:
            tiers = {TIER_LABELS[t]: {"trajectories": n, "bytes": b} for t, (n, b) in self._occ.items()}
            return {
                "boot": self.boot,
                "uptime_s": time.monotonic() - self._started,
                "tools": len(self._tools),
                "tools_folded": self._tools_folded,
                "observations": int(self.predictor.n_observations),
                "paused": len(self._paused),
                "restored_after_restart": self._restored,
                "lost_after_restart": self._lost_now,
                "decisions": dict(self._decisions),
                "tiers": tiers,
                "policy": self.config.policy,
                "predictor": type(self.predictor).__name__,
            }

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Flush and close LMDB.  Idempotent; later calls raise ServiceError."""
        with self._lock:
            if self._closed:
                return
            try:
                if self._env is not None:
                    self._env.sync(True)
            finally:
                self._release()

    def __enter__(self) -> "ServiceState":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _lock_data_dir(data_dir: Path) -> int:
    """Take an exclusive, non-blocking flock on ``<data_dir>/service.lock``.

    Returns the fd (closing it releases the lock).
    Raises: ValueError if another service (process or object) holds it.
    """
    Path(data_dir).mkdir(parents=True, exist_ok=True)
    fd = os.open(confined_path(data_dir, "service.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise ValueError(f"data dir {data_dir} is in use by another kvtier service") from None
    return fd


def check_data_dir_free(data_dir: Path) -> None:
    """Raise ValueError if a running service holds ``data_dir`` (a start-up courtesy check)."""
    os.close(_lock_data_dir(data_dir))


def _finite(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def _one_line(exc: BaseException) -> str:
    msg = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
    return msg.strip().splitlines()[0] if msg.strip() else type(exc).__name__
