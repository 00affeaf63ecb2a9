"""Device <-> host <-> store block movement.

Transfers are plain data (:mod:`kvtier.dma.spec`); movers execute them, one per
(source, destination) pair (:mod:`kvtier.dma.movers`); engine KV layouts and the
layer-major stored frame live in :mod:`kvtier.dma.layouts`; staging frames in
:mod:`kvtier.dma.staging`.  This package depends on torch (and may use ``store``);
it never decides what to move.
"""
from kvtier.dma.spec import DeviceBlocks, Endpoint, HostFrames, JobResult, StoreBlocks, TransferSpec

__all__ = ["DeviceBlocks", "Endpoint", "HostFrames", "JobResult", "StoreBlocks", "TransferSpec"]
