"""vLLM's own CPU tier, alone, for the ``vllm-cpu-tier`` offload of an in-process
engine (:mod:`.vllm_inprocess`): ``TieringOffloadingSpec`` with no secondary tier (its LRU over
``cpu_bytes_to_use`` and nothing below), with kvtier's CPU copy worker on the
CPU platform (vLLM's own refuses it).  Nothing of kvtier's policy or store runs."""
from __future__ import annotations

from typing import Any

from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec


class CpuTierOnlySpec(TieringOffloadingSpec):
    def get_worker(self, kv_caches: Any) -> Any:
        from kvtier.engine_adapter.vllm_cpu_worker import worker_for
        return worker_for(self, kv_caches, super().get_worker)
