"""Movers: one per (source, destination) endpoint pair; they execute :class:`TransferSpec` s.

    DeviceToHostMover  device blocks -> staging frames  (gather; CUDA copy stream)
    DeviceToStoreMover device blocks -> store buffers   (two-phase prepare_store/complete_store:
                                                         no staging frame, one copy fewer)
    HostToDeviceMover  staging frames -> device blocks  (scatter, in layer groups)
    HostToStoreMover   staging frames -> store keys     (store.put, tier host|nvme)
    StoreToHostMover   store keys     -> staging frames (store.get; misses reported)

API (all movers)::

    c = mover.transfer_async(job_id, spec)   # validates now (ValueError), runs later
    await c  /  c.result(timeout)            # -> JobResult
    c.wait_group(g)                          # H2D: layers of group g are usable
    mover.get_finished()                     # -> [JobResult] finished since the last call

Ordering guarantees (documented contract, enforced by tests):

* Jobs submitted to one mover are issued and complete in submission order
  (one issuer thread; on CUDA one copy stream, so the GPU keeps that order).
* Within a job, layer groups complete in increasing order; when group g is
  reported (``wait_group(g)`` returns / ``group_done(g)``), layers of groups
  <= g are fully written and visible to the caller's stream.
* A job's result is set after all of its groups.  ``get_finished`` returns
  results in completion order, each exactly once.
* Nothing is ordered across movers: chain them by awaiting a completion
  (e.g. offload = D2H, then HostToStore on the same frames).
* On CUDA, a device-sourced job first waits (on the GPU) for the work queued
  on the submitting thread's current stream, so it copies what the engine wrote.

Without CUDA the same code runs with CPU tensors: "events" are None and a
group is complete as soon as its copies returned.  Movers never decide
anything: which blocks, where, and when is the caller's business.
"""
from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from abc import ABC, abstractmethod
from concurrent.futures import Future
from typing import Any, Callable, Sequence

import torch

from kvtier.dma.layouts import KVLayout
from kvtier.dma.spec import DeviceBlocks, Endpoint, HostFrames, JobResult, StoreBlocks, TransferSpec
from kvtier.dma.staging import FramePool, runs
from kvtier.store.protocol import BlockStore
from kvtier.util.tiers import Tier

STRATEGIES = ("batched", "per_block")


class TransferError(RuntimeError):
    """A transfer failed; its destination holds garbage."""


class Completion:
    """Awaitable completion of one transfer job (thread-safe)."""

    def __init__(self, job_id: int, groups: int) -> None:
        self.job_id = job_id
        self.future: Future[JobResult] = Future()
        self._recorded = [threading.Event() for _ in range(groups)]   # set by the issuer
        self._done = [threading.Event() for _ in range(groups)]       # host-visible completion
        self._events: list[Any] = [None] * groups                     # CUDA events (None on CPU)
        self._on_group: Callable[[int], None] | None = None
        self.failed: str = ""

    @property
    def groups(self) -> int:
        return len(self._done)

    def done(self) -> bool:
        return self.future.done()

    def result(self, timeout: float | None = None) -> JobResult:
        """Block until finished; returns the JobResult (ok may be False)."""
        return self.future.result(timeout)

    def __await__(self):
        return asyncio.wrap_future(self.future).__await__()

    def add_done_callback(self, fn: Callable[[JobResult], None]) -> None:
        self.future.add_done_callback(lambda f: fn(f.result()))

    def group_done(self, g: int) -> bool:
        return self._done[g].is_set()

    def wait_group(self, g: int, timeout: float | None = None) -> None:
        """Make layer group ``g`` usable by the caller.

        CPU: blocks until its copies are done.  CUDA: blocks only until the
        copies are queued, then makes the caller's current stream wait for
        them on the GPU.  Raises TransferError if the job failed, TimeoutError.
        """
        if not self._recorded[g].wait(timeout):
            raise TimeoutError(f"job {self.job_id}: layer group {g} not issued within {timeout}s")
        if self.failed:
            raise TransferError(f"job {self.job_id} failed: {self.failed}")
        ev = self._events[g]
        if ev is not None:
            torch.cuda.current_stream().wait_event(ev)

    # -- issuer side --------------------------------------------------------
    def _fail_all(self, msg: str) -> None:
        self.failed = msg
        for e in (*self._recorded, *self._done):
            e.set()


class _Job:
    __slots__ = ("comp", "spec", "t0", "keep", "start_event")

    def __init__(self, comp: Completion, spec: TransferSpec, start_event: Any) -> None:
        self.comp, self.spec, self.t0, self.keep, self.start_event = comp, spec, time.perf_counter(), [], start_event


class Mover(ABC):
    """Executes transfers of one (src, dst) endpoint pair on a private issuer thread.

    ``transfer_async`` validates the spec synchronously (ValueError for a
    wrong pair, unknown layout, bad ids, a reused live job id) and never
    blocks on the copy.  ``close()`` drains queued jobs then stops.
    """

    pair: tuple[Endpoint, Endpoint]

    def __init__(self, *, cuda: bool | None = None) -> None:
        self.cuda = torch.cuda.is_available() if cuda is None else bool(cuda)
        self.stream = torch.cuda.Stream() if self.cuda else None
        self._lock = threading.Lock()
        self._live: set[int] = set()          # guarded by _lock
        self._finished: list[JobResult] = []  # guarded by _lock
        self._q: queue.Queue = queue.Queue()
        self._cq: queue.Queue = queue.Queue()
        self._closed = False
        self._issuer = threading.Thread(target=self._issue_loop, name=f"kvtier-{type(self).__name__}", daemon=True)
        self._completer = threading.Thread(target=self._complete_loop, name="kvtier-completer", daemon=True)
        self._issuer.start()
        self._completer.start()

    # -- public -------------------------------------------------------------
    def transfer_async(self, job_id: int, spec: TransferSpec, *,
                       on_group: Callable[[int], None] | None = None) -> Completion:
        """Queue ``spec`` as job ``job_id``; returns its awaitable Completion.

        ``on_group(g)`` (optional) is called once per layer group when that
        group is complete, in group order, on a mover thread, before the next
        group's completion is reported; it must be quick and must not raise.
        Raises ValueError for a bad spec (nothing queued then).
        """
        if self._closed:
            raise RuntimeError("mover is closed")
        if spec.pair != self.pair:
            raise ValueError(f"{type(self).__name__} moves {self.pair[0]}->{self.pair[1]}, "
                             f"not {spec.pair[0]}->{spec.pair[1]}")
        groups = self._validate(spec)
        with self._lock:
            if job_id in self._live:
                raise ValueError(f"job id {job_id} is still in flight")
            self._live.add(job_id)
        start_event = None
        if self.cuda and Endpoint.DEVICE in spec.pair:
            start_event = torch.cuda.Event()
            start_event.record(torch.cuda.current_stream())
        comp = Completion(job_id, groups)
        comp._on_group = on_group
        self._q.put(_Job(comp, spec, start_event))
        return comp

    def get_finished(self) -> list[JobResult]:
        """Results finished since the last call, in completion order (each once)."""
        with self._lock:
            out, self._finished = self._finished, []
        return out

    def close(self) -> None:
        """Finish queued jobs, then stop the threads.  Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._q.put(None)
        self._issuer.join()
        self._completer.join()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- subclass hooks -----------------------------------------------------
    @abstractmethod
    def _validate(self, spec: TransferSpec) -> int:
        """Check the spec against this mover's resources; return the number of groups."""

    @abstractmethod
    def _issue(self, job: _Job) -> tuple[int, tuple[bytes, ...]]:
        """Issue the copies (calling ``self._group(job, g)`` after each group); return (bytes, missing keys)."""

    # -- machinery ----------------------------------------------------------
    def _ctx(self):
        return torch.cuda.stream(self.stream) if self.cuda else contextlib.nullcontext()

    def _group(self, job: _Job, g: int) -> None:
        """Mark group g issued: on CPU it is complete now; on CUDA record an event."""
        comp = job.comp
        if self.cuda:
            ev = torch.cuda.Event()
            ev.record(self.stream)
            comp._events[g] = ev
            comp._recorded[g].set()
            self._cq.put(("group", job, g))
        else:
            comp._recorded[g].set()
            comp._done[g].set()
            if comp._on_group is not None:
                comp._on_group(g)

    def _issue_loop(self) -> None:
        while True:
            job = self._q.get()
            if job is None:
                self._cq.put(None)
                return
            try:
                with self._ctx():
                    if job.start_event is not None:
                        self.stream.wait_event(job.start_event)
                    nbytes, missing = self._issue(job)
                self._cq.put(("final", job, nbytes, missing, ""))
            except Exception as exc:  # reported through the completion, never lost
                job.comp._fail_all(f"{type(exc).__name__}: {exc}")
                self._cq.put(("final", job, 0, (), f"{type(exc).__name__}: {exc}"))

    def _complete_loop(self) -> None:
        while True:
            item = self._cq.get()
            if item is None:
                return
            if item[0] == "group":
                _, job, g = item
                ev = job.comp._events[g]
                ev.synchronize()
                job.comp._done[g].set()
                if job.comp._on_group is not None:
                    job.comp._on_group(g)
                continue
            _, job, nbytes, missing, error = item
            if self.cuda and error:
                self.stream.synchronize()   # copies issued before the failure still use job.keep
            job.keep.clear()
            res = JobResult(job_id=job.comp.job_id, ok=not error and not missing, nbytes=nbytes,
                            seconds=time.perf_counter() - job.t0, error=error, missing=tuple(missing))
            with self._lock:
                self._live.discard(job.comp.job_id)
                self._finished.append(res)
            job.comp.future.set_result(res)


class _DeviceMover(Mover):
    """Shared by D2H and H2D: named device layouts, a staging pool, a copy strategy."""

    def __init__(self, pool: FramePool, *, strategy: str = "batched", copy_engine: str = "torch",
                 cuda: bool | None = None) -> None:
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown copy strategy {strategy!r}; known: {', '.join(STRATEGIES)}")
        if copy_engine not in ("torch", "cupy"):
            raise ValueError(f"unknown copy engine {copy_engine!r}; known: torch, cupy")
        super().__init__(cuda=cuda)
        if copy_engine == "cupy":
            if not self.cuda:
                raise ValueError("copy engine 'cupy' needs CUDA")
            import cupy  # noqa: F401  (optional dependency: pip install kvtier[cuda])
        self.pool = pool
        self.strategy = strategy
        self.copy_engine = copy_engine
        self._layouts: dict[str, KVLayout] = {}   # guarded by _lock

    def register_layout(self, name: str, layout: KVLayout) -> None:
        """Make ``layout`` addressable by ``DeviceBlocks(name, ...)``; replaces an older one."""
        if layout.fmt != self.pool.fmt:
            raise ValueError(f"layout {name!r} has frame format {layout.fmt}, the pool holds {self.pool.fmt}")
        with self._lock:
            self._layouts[name] = layout

    def unregister_layout(self, name: str) -> None:
        with self._lock:
            self._layouts.pop(name, None)

    def layout(self, name: str) -> KVLayout:
        with self._lock:
            try:
                return self._layouts[name]
            except KeyError:
                known = ", ".join(sorted(self._layouts)) or "none"
                raise ValueError(f"unknown device layout {name!r}; registered: {known}") from None

    def _check(self, dev: DeviceBlocks, host: HostFrames) -> KVLayout:
        lay = self.layout(dev.layout)
        lay.check_block_ids(dev.block_ids)
        bad = [f for f in host.frame_ids if not (0 <= f < self.pool.capacity)]
        if bad:
            raise ValueError(f"frame ids {bad[:5]} out of range [0, {self.pool.capacity})")
        return lay

    def _raw_copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """dst <- src, asynchronous on the copy stream (cupy: a raw cudaMemcpyAsync of contiguous bytes)."""
        if self.copy_engine == "cupy" and dst.is_contiguous() and src.is_contiguous():
            import cupy
            kind = (cupy.cuda.runtime.memcpyDeviceToHost if dst.device.type == "cpu"
                    else cupy.cuda.runtime.memcpyHostToDevice)
            cupy.cuda.runtime.memcpyAsync(dst.data_ptr(), src.data_ptr(), src.numel() * src.element_size(),
                                          kind, self.stream.cuda_stream)
        else:
            dst.copy_(src, non_blocking=self.cuda)

    def calibrate(self, layout_name: str, block_ids: Sequence[int], frame_ids: Sequence[int],
                  repeats: int = 3) -> dict[str, float]:
        """Time each copy strategy on real blocks and keep the faster one.

        Mutates ``self.strategy``; returns seconds per strategy (best of
        ``repeats``).  Benchmark-only: never called on a hot path.
        """
        spec = self._calibration_spec(layout_name, block_ids, frame_ids)
        timings = {}
        saved = self.strategy
        for s in STRATEGIES:
            self.strategy = s
            best = float("inf")
            for r in range(repeats):
                t0 = time.perf_counter()
                res = self.transfer_async(-1 - r, spec).result()
                best = min(best, time.perf_counter() - t0)
                if not res.ok:
                    self.strategy = saved
                    raise TransferError(res.error)
            timings[s] = best
        self.strategy = min(timings, key=timings.get)
        return timings

    @abstractmethod
    def _calibration_spec(self, layout_name, block_ids, frame_ids) -> TransferSpec: ...


class DeviceToHostMover(_DeviceMover):
    """Gather device blocks into staging frames (frame i <- block i, all layers).

    ``batched``: one vectorised gather into a device staging stack, then one
    DMA per run of consecutive frames.  ``per_block``: one copy per block, layer
    and K/V straight into the frame.  ``calibrate`` picks the faster.
    """

    pair = (Endpoint.DEVICE, Endpoint.STAGING)

    def _validate(self, spec):
        self._check(spec.src, spec.dst)
        return 1

    def _calibration_spec(self, layout_name, block_ids, frame_ids):
        return TransferSpec(DeviceBlocks(layout_name, tuple(block_ids)), HostFrames(tuple(frame_ids)))

    def _issue(self, job):
        spec = job.spec
        lay = self.layout(spec.src.layout)
        ids, fids = spec.src.block_ids, spec.dst.frame_ids
        frames = self.pool.frames
        fr = runs(fids)
        if self.strategy == "batched":
            if lay.device.type == "cpu" and len(fr) == 1:
                _, f0, n = fr[0]                       # gather straight into the frames
                lay.gather(ids, frames[f0:f0 + n])
            else:
                staging = torch.empty((len(ids), *lay.fmt.shape), dtype=lay.fmt.dtype, device=lay.device)
                job.keep.append(staging)
                lay.gather(ids, staging)
                for pos, f0, n in fr:
                    self._raw_copy(frames[f0:f0 + n], staging[pos:pos + n])
        else:
            T = lay.fmt.block_tokens
            for b, f in zip(ids, fids):
                t = lay.valid_tokens(b)
                for l in range(lay.fmt.layers):
                    k, v = lay.block_views(b, l)
                    frames[f, l, 0, :t].copy_(k, non_blocking=self.cuda)
                    frames[f, l, 1, :t].copy_(v, non_blocking=self.cuda)
                if t < T:
                    frames[f, :, :, t:].zero_()
        self._group(job, 0)
        return len(ids) * lay.fmt.frame_bytes, ()


class HostToDeviceMover(_DeviceMover):
    """Scatter staging frames into device blocks, in ``spec.layer_groups`` groups.

    Each group (consecutive layers) gets its own completion event, so the
    engine can run layer 0.. while later layers are still in flight.
    """

    pair = (Endpoint.STAGING, Endpoint.DEVICE)

    def _validate(self, spec):
        lay = self._check(spec.dst, spec.src)
        return len(lay.fmt.layer_groups(spec.layer_groups))

    def _calibration_spec(self, layout_name, block_ids, frame_ids):
        return TransferSpec(HostFrames(tuple(frame_ids)), DeviceBlocks(layout_name, tuple(block_ids)))

    def _issue(self, job):
        spec = job.spec
        lay = self.layout(spec.dst.layout)
        ids, fids = spec.dst.block_ids, spec.src.frame_ids
        frames = self.pool.frames
        fr = runs(fids)
        staging = None
        for g, lr in enumerate(lay.fmt.layer_groups(spec.layer_groups)):
            if self.strategy == "batched":
                if lay.device.type == "cpu":
                    src = frames[fr[0][1]:fr[0][1] + len(fids)] if len(fr) == 1 else frames[list(fids)]
                    lay.scatter(src, ids, lr)
                else:
                    if staging is None:
                        staging = torch.empty((len(ids), *lay.fmt.shape), dtype=lay.fmt.dtype, device=lay.device)
                        job.keep.append(staging)
                    sl = slice(lr.start, lr.stop)
                    if len(lr) == lay.fmt.layers:      # whole frames: one DMA per run
                        for pos, f0, n in fr:
                            self._raw_copy(staging[pos:pos + n], frames[f0:f0 + n])
                    else:                              # layer slice of each frame is contiguous
                        for i, f in enumerate(fids):
                            self._raw_copy(staging[i, sl], frames[f, sl])
                    lay.scatter(staging, ids, lr)
            else:
                for b, f in zip(ids, fids):
                    t = lay.valid_tokens(b)
                    for l in lr:
                        k, v = lay.block_views(b, l)
                        k.copy_(frames[f, l, 0, :t], non_blocking=self.cuda)
                        v.copy_(frames[f, l, 1, :t], non_blocking=self.cuda)
            self._group(job, g)
        return len(ids) * lay.fmt.frame_bytes, ()


class DeviceToStoreMover(_DeviceMover):
    """Gather device blocks straight into the store's own buffers (two-phase store).

    ``store.prepare_store(keys, tier)`` hands out a writable buffer per new
    key (a host frame of the store, or its aligned NVMe staging); the blocks
    are gathered into those, then ``complete_store(success=True)`` publishes
    them (NVMe: after the durable write).  Compared with D2H into staging
    frames + ``put_many``, the frame -> store copy disappears.  Keys the store
    already holds (or is storing) are skipped.  A failure aborts the prepared
    blocks (``complete_store(success=False)``): nothing half-written is ever
    visible.  On CUDA the gather runs on the copy stream into a device staging
    stack, each block is copied into its buffer, and the stream is synchronised
    before ``complete_store`` (the store must see the bytes).
    """

    pair = (Endpoint.DEVICE, Endpoint.STORE)

    def __init__(self, pool: FramePool, store: BlockStore, **kw: Any) -> None:
        super().__init__(pool, **kw)
        self.store = store

    def _validate(self, spec):
        self.layout(spec.src.layout).check_block_ids(spec.src.block_ids)
        return 1

    def _calibration_spec(self, layout_name, block_ids, frame_ids):
        raise ValueError("DeviceToStoreMover has a single strategy; nothing to calibrate")

    def _issue(self, job):
        spec = job.spec
        lay = self.layout(spec.src.layout)
        fmt = lay.fmt
        ps = self.store.prepare_store(list(spec.dst.keys), tier=spec.dst.tier)
        done = False
        try:
            block_of = {k: b for k, b in zip(spec.dst.keys, spec.src.block_ids)}
            ids = [block_of[bytes(s.key)] for s in ps.slots]
            outs = [_buffer_frame(s.buffer, fmt) for s in ps.slots]
            if ids:
                if lay.device.type == "cpu":
                    for b, out in zip(ids, outs):
                        lay.gather((b,), out)
                else:
                    staging = torch.empty((len(ids), *fmt.shape), dtype=fmt.dtype, device=lay.device)
                    job.keep.append(staging)
                    lay.gather(ids, staging)
                    for i, out in enumerate(outs):
                        out[0].copy_(staging[i], non_blocking=True)
                    self.stream.synchronize()
            stored = self.store.complete_store(ps.handle, success=True)
            done = True
        finally:
            if not done:
                with contextlib.suppress(Exception):
                    self.store.complete_store(ps.handle, success=False)
        self._group(job, 0)
        return stored * fmt.frame_bytes, ()


def _buffer_frame(buf: memoryview, fmt) -> torch.Tensor:
    """A ``[1, L, 2, T, H, D]`` tensor over a writable store buffer of one frame (no copy)."""
    return torch.frombuffer(buf, dtype=torch.uint8)[:fmt.frame_bytes].view(fmt.dtype).view(1, *fmt.shape)


def _frame_bytes_view(pool: FramePool, fid: int) -> memoryview:
    """A writable byte view of one (contiguous) frame, shared with the pool."""
    return memoryview(pool.frames[fid].view(-1).view(torch.uint8).numpy())


class HostToStoreMover(Mover):
    """Write staging frames to the tiered store under their content keys.

    Keys the store already holds are skipped (content addressing: equal keys,
    equal bytes).  A failed put fails the job; keys written before the failure
    stay stored and valid.
    """

    pair = (Endpoint.STAGING, Endpoint.STORE)

    def __init__(self, pool: FramePool, store: BlockStore) -> None:
        super().__init__(cuda=False)
        self.pool, self.store = pool, store

    def _validate(self, spec):
        bad = [f for f in spec.src.frame_ids if not (0 <= f < self.pool.capacity)]
        if bad:
            raise ValueError(f"frame ids {bad[:5]} out of range [0, {self.pool.capacity})")
        return 1

    def _issue(self, job):
        spec = job.spec
        todo = [(f, k) for f, k in zip(spec.src.frame_ids, spec.dst.keys) if not self.store.contains(k)]
        stored = 0
        if todo:
            datas = [_frame_bytes_view(self.pool, f) for f, _ in todo]
            stored = _store_put_many(self.store, [k for _, k in todo], datas, spec.dst.tier)
        self._group(job, 0)
        return stored * self.pool.fmt.frame_bytes, ()


class StoreToHostMover(Mover):
    """Read store blocks into staging frames; a missing or corrupt block is reported in ``missing``."""

    pair = (Endpoint.STORE, Endpoint.STAGING)

    def __init__(self, pool: FramePool, store: BlockStore) -> None:
        super().__init__(cuda=False)
        self.pool, self.store = pool, store

    def _validate(self, spec):
        bad = [f for f in spec.dst.frame_ids if not (0 <= f < self.pool.capacity)]
        if bad:
            raise ValueError(f"frame ids {bad[:5]} out of range [0, {self.pool.capacity})")
        return 1

    def _issue(self, job):
        spec = job.spec
        outs = [_frame_bytes_view(self.pool, f) for f in spec.dst.frame_ids]
        hits = self.store.get_many(list(spec.src.keys), outs)
        missing = [k for k, ok in zip(spec.src.keys, hits) if not ok]
        self._group(job, 0)
        return (len(spec.src.keys) - len(missing)) * self.pool.fmt.frame_bytes, tuple(missing)


def _store_put_many(store: BlockStore, keys: list[bytes], datas: list[memoryview], tier: Tier) -> int:
    """Put blocks into the requested tier in one batch; returns how many were new."""
    return int(store.put_many(keys, datas, tier=tier))


MOVERS: dict[tuple[Endpoint, Endpoint], type[Mover]] = {
    cls.pair: cls for cls in (DeviceToHostMover, HostToDeviceMover, HostToStoreMover, StoreToHostMover,
                              DeviceToStoreMover)
}


def mover_class(src: Endpoint | str, dst: Endpoint | str) -> type[Mover]:
    """The mover class for a (src, dst) pair; ValueError listing the known pairs otherwise."""
    try:
        return MOVERS[(Endpoint(src), Endpoint(dst))]
    except (KeyError, ValueError):
        known = ", ".join(f"{a}->{b}" for a, b in MOVERS)
        raise ValueError(f"no mover for {src}->{dst}; known: {known}") from None
