"""Helpers of the transformers hook that know transformers' cache and the store's
free room (no session state): the forward keyword for the cache, a cache's
bytes, the store's free bytes per tier, and a model's namespace id."""
from __future__ import annotations

import hashlib
from typing import Any

import torch

def cache_kw() -> str:
    """The forward keyword for the cache: ``cache`` (transformers >= 5.x) or ``past_key_values``."""
    try:
        import inspect

        from transformers import LlamaForCausalLM
        return "cache" if "cache" in inspect.signature(LlamaForCausalLM.forward).parameters else "past_key_values"
    except Exception:  # pragma: no cover
        return "past_key_values"


CACHE_KW = cache_kw()


def cache_bytes(cache: Any) -> int:
    if cache is None:
        return 0
    return sum(t.numel() * t.element_size() for l in cache.layers for t in (l.keys, l.values) if t is not None)


def free_bytes(store: Any) -> dict[str, float]:
    """Bytes of room left per store tier.  A store that cannot say (closed,
    broken: its ``stats`` raises) has no room: the policy must see a broken
    store as a full one, never as an infinite one."""
    try:
        st = store.stats()
        return {"host": float((st.host_frames_total - st.host_frames_used) * st.slot_bytes),
                "nvme": float((st.nvme_slots_total - st.nvme_slots_used) * st.slot_bytes)}
    except Exception:
        return {"host": 0.0, "nvme": 0.0}


def model_id(model: Any) -> str:
    """Name for the key namespace: the checkpoint name, else a digest of the weights (tiny models)."""
    name = getattr(model.config, "name_or_path", "") or ""
    if name:
        return name
    h = hashlib.blake2b(digest_size=12)
    with torch.no_grad():
        for k, p in sorted(model.state_dict().items()):
            h.update(k.encode())
            h.update(p.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return f"{model.config.model_type}-{h.hexdigest()}"
