"""An in-process vLLM engine (the CPU build runs it on any machine), with or
without kvtier's connector, that answers one request at a time.

    spec = EngineSpec(model=path, engine_blocks=48, kvtier={"data_dir": d, "host_gb": 0.01})
    with LiveEngine(spec) as eng:
        r = eng.generate(token_ids, max_tokens=8, kv_transfer_params={"kvtier": {"tool": "pytest"}})
        r.tokens, r.cached_tokens, r.ttft_s
        eng.kvtier_stats()          # the tier's counters (None without kvtier)

Configurations (``EngineSpec.offload``): ``None`` is vLLM's own prefix cache
alone; ``"kvtier"`` is ``KvtierConnector`` with the ``kvtier`` options;
``"vllm-cpu-tier"`` is vLLM's own CPU tier (``TieringOffloadingSpec`` with no
secondary tier: its LRU and nothing below), run on kvtier's CPU copy worker
because vLLM's refuses the CPU platform.  ``EngineSpec.link_gbps`` gives either
connector configuration the scale model's link on that worker (each copy
finished after the time a link of that speed would take; docs/live.md).

The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, set
before vLLM is imported); everything is greedy, so two engines given the same
prompts produce the same tokens unless a KV block came back wrong.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

BLOCK_TOKENS = 32          # vLLM's CPU attention needs a multiple of 32


class VllmMissing(RuntimeError):
    """No runnable vLLM in this environment (the message names the install line)."""


INSTALL_HINT = ("a live vLLM engine needs a runnable vLLM; on a CPU-only machine that is vLLM's CPU build in an "
                "environment of its own: `bash ci/live-env.sh` makes one and prints its folder VENV, then run "
                "VENV/bin/kvtier")


def require_live_vllm() -> str:
    """The installed vLLM's version if it can run an engine here (its CPU build,
    or a CUDA build on a GPU machine).  Raises VllmMissing naming the install line."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")   # stdout carries a command's output only
    # vLLM's CPU build pins its threads to the last core by default: every engine on a shared
    # machine then queues on that one core while the others idle
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    try:
        import vllm
        from vllm.platforms import current_platform
    except Exception as exc:
        raise VllmMissing(f"{INSTALL_HINT} (import vllm: {type(exc).__name__}: {exc})") from None
    if not (current_platform.is_cpu() or current_platform.is_cuda_alike()):
        raise VllmMissing(f"{INSTALL_HINT} (the installed vLLM {vllm.__version__} finds no device it runs on here)")
    from kvtier.engine_adapter.vllm_version import check_vllm_version
    check_vllm_version()
    return str(vllm.__version__)


@dataclass(frozen=True)
class EngineSpec:
    """One engine's settings.

    engine_blocks: the engine's own KV cache, in blocks of ``block_tokens``.
    cpu_bytes: vLLM's CPU tier (the primary offload tier) for the connector configurations.
    kvtier: the ``kvtier`` options of the connector (``offload="kvtier"``).
    link_gbps: the CPU copy worker's link for the connector configurations (None: copies
    finish at once); for ``"kvtier"`` it is the ``link_gbps`` option (and wins over one in ``kvtier``).
    kv_events: the ZMQ endpoint vLLM publishes its KV events on (``--kv-events-config``); by vLLM's
    rule ``tcp://*:PORT`` and ``ipc://PATH`` bind, ``tcp://HOST:PORT`` connects to a subscriber's."""
    model: str
    engine_blocks: int = 64
    block_tokens: int = BLOCK_TOKENS
    max_model_len: int = 2048
    offload: str | None = None
    cpu_bytes: int = 8 << 20
    kvtier: Mapping[str, Any] = field(default_factory=dict)
    dtype: str = "float32"
    max_num_seqs: int = 4
    link_gbps: float | None = None
    log_stats: bool = False      # vLLM's own metrics (LiveEngine.engine_counters)
    kv_events: str | None = None     # vLLM's KV events published on this ZMQ endpoint (None: off)

    def kv_transfer_config(self) -> dict | None:
        """vLLM's ``kv_transfer_config`` for ``offload``.  Raises ValueError for
        an unknown configuration, or a link without a connector."""
        link = {"link_gbps": float(self.link_gbps)} if self.link_gbps is not None else {}
        if self.offload is None:
            if link:
                raise ValueError("link_gbps needs a connector configuration (offload 'kvtier' or 'vllm-cpu-tier')")
            return None
        if self.offload == "kvtier":
            return {"kv_connector": "KvtierConnector", "kv_role": "kv_both",
                    "kv_connector_extra_config": {"cpu_bytes_to_use": int(self.cpu_bytes),
                                                  "kvtier": {**self.kvtier, **link}}}
        if self.offload == "vllm-cpu-tier":
            return {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                    "kv_connector_extra_config": {"cpu_bytes_to_use": int(self.cpu_bytes),
                                                  "spec_name": "CpuTierOnlySpec",
                                                  "spec_module_path": "kvtier.engine_adapter.vllm_cpu_tier",
                                                  **link}}
        raise ValueError(f"unknown offload configuration {self.offload!r}; known: None, 'kvtier', 'vllm-cpu-tier'")


@dataclass(frozen=True)
class Result:
    """One request's answer: generated token ids, prompt tokens vLLM did not
    compute (served by its prefix cache or a connector), and its timings."""
    tokens: tuple[int, ...]
    prompt_tokens: int
    cached_tokens: int
    ttft_s: float
    total_s: float


class LiveEngine:
    """A vLLM ``LLM`` in this process (see the module doc).  Not thread-safe:
    one caller drives it.  Raises VllmMissing when vLLM cannot run here."""

    def __init__(self, spec: EngineSpec) -> None:
        require_live_vllm()
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        from vllm import LLM
        from vllm.config import KVEventsConfig, KVTransferConfig
        self.spec = spec
        kv = spec.kv_transfer_config()
        events = (KVEventsConfig(enable_kv_cache_events=True, publisher="zmq", endpoint=spec.kv_events)
                  if spec.kv_events else None)
        self.llm = LLM(model=spec.model, tokenizer=spec.model, dtype=spec.dtype, block_size=spec.block_tokens,
                       max_model_len=min(spec.max_model_len, (spec.engine_blocks - 1) * spec.block_tokens),
                       enable_prefix_caching=True,
                       num_gpu_blocks_override=spec.engine_blocks, gpu_memory_utilization=0.05,
                       enforce_eager=True, max_num_seqs=spec.max_num_seqs, seed=0,
                       disable_log_stats=not spec.log_stats,
                       kv_transfer_config=KVTransferConfig(**kv) if kv else None, kv_events_config=events)
        self._closed = False

    def __enter__(self) -> "LiveEngine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def tokenizer(self) -> Any:
        return self.llm.get_tokenizer()

    def generate(self, prompt: Sequence[int], *, max_tokens: int = 8,
                 kv_transfer_params: Mapping[str, Any] | None = None) -> Result:
        """Greedy decoding of ``prompt`` (token ids).  ``kv_transfer_params``
        goes to the connector as a client's request body would carry it."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        extra = {"kv_transfer_params": dict(kv_transfer_params)} if kv_transfer_params is not None else None
        sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, extra_args=extra)
        t0 = time.perf_counter()
        out = self.llm.generate([TokensPrompt(prompt_token_ids=list(prompt))], sp, use_tqdm=False)[0]
        total = time.perf_counter() - t0
        m = getattr(out, "metrics", None)
        ttft = getattr(m, "first_token_latency", None) if m is not None else None
        return Result(tokens=tuple(out.outputs[0].token_ids), prompt_tokens=len(prompt),
                      cached_tokens=int(out.num_cached_tokens or 0),
                      ttft_s=float(ttft) if ttft else total, total_s=total)

    def scheduler(self) -> Any:
        return self.llm.llm_engine.engine_core.engine_core.scheduler

    def connector(self) -> Any:
        """The scheduler-side KV connector (None without one)."""
        return getattr(self.scheduler(), "connector", None)

    def kvtier(self) -> Any:
        """kvtier's tier in this engine (None in the other configurations)."""
        c = self.connector()
        find = getattr(c, "_kvtier", None)
        return find() if find is not None else None

    def kvtier_stats(self) -> dict | None:
        t = self.kvtier()
        return t.stats() if t is not None else None

    def engine_counters(self) -> dict[str, float]:
        """vLLM's own counters now (``vllm:prefix_cache_hits``, ``vllm:external_prefix_cache_hits``,
        ``vllm:num_preemptions``, ...: the engine's, summed over labels), plus
        ``kvtier_chunks_loaded`` (0 without kvtier).  Raises RuntimeError unless
        the spec asked for ``log_stats``."""
        if not self.spec.log_stats:
            raise RuntimeError("engine_counters needs EngineSpec(log_stats=True)")
        out: dict[str, float] = {}
        for m in self.llm.get_metrics():
            v = getattr(m, "value", None)
            if isinstance(v, (int, float)):
                out[m.name] = out.get(m.name, 0.0) + float(v)
        s = self.kvtier_stats()
        out["kvtier_chunks_loaded"] = float(s["chunks_loaded"]) if s is not None else 0.0
        return out

    def settle(self, timeout_s: float = 30.0) -> None:
        """Wait until kvtier's tier has no job in flight and the engine has
        taken their results (a few idle engine steps)."""
        t = self.kvtier()
        deadline = time.monotonic() + timeout_s
        while t is not None and time.monotonic() < deadline:
            t.drain_jobs()
            self.llm.llm_engine.engine_core.engine_core.step_fn()
            if not t.has_pending_work():
                return
            time.sleep(0.005)

    def close(self) -> None:
        """Shut the engine down (kvtier's tier closes its store).  Idempotent."""
        if self._closed:
            return
        self._closed = True
        core = self.llm.llm_engine.engine_core
        shutdown = getattr(core, "shutdown", None)
        if shutdown is not None:
            shutdown()
        else:
            core.engine_core.shutdown()
        del self.llm
