"""A request's prompt tokens, as the engine will see them: the engine's own ``POST /tokenize``.

The router hashes the same tokens the engine hashes only if it renders the prompt the same way
(the model's chat template, its tool definitions, the generation prompt, special tokens).  The
engine's ``/tokenize`` does exactly that, so the router asks it instead of carrying a tokenizer
and a template of its own: one more round trip per request (the API server tokenizes; the
engine's scheduler is not involved).  ``/v1/completions`` with token ids needs no call.

What goes to ``/tokenize``: for chat, ``model``, ``messages``, ``tools``,
``add_generation_prompt``, ``continue_final_message``, ``add_special_tokens``,
``chat_template``, ``chat_template_kwargs`` as the request has them; for completions, ``model``,
``prompt`` (the first, for a batch) and ``add_special_tokens``.  Returns None when the engine
cannot tokenize it (the request then routes on load alone, and the upstream gives its own error).
"""
from __future__ import annotations

from typing import Any

CHAT_FIELDS = ("model", "messages", "tools", "add_generation_prompt", "continue_final_message",
               "add_special_tokens", "chat_template", "chat_template_kwargs")
MAX_TOKENS = 4_000_000


def _ids(x: Any) -> list[int] | None:
    if isinstance(x, list) and x and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in x):
        return x[:MAX_TOKENS]
    return None


def tokenize_body(kind: str, body: dict) -> dict | list[int] | None:
    """What to send to ``/tokenize`` for ``body`` (a dict), or the token ids themselves when the
    body carries them, or None when it carries nothing to tokenize.  Pure."""
    if kind == "chat":
        return {k: body[k] for k in CHAT_FIELDS if k in body and body[k] is not None}
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
        return _ids(prompt[0])
    ids = _ids(prompt)
    if ids is not None:
        return ids
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        return None
    out: dict[str, Any] = {"prompt": prompt}
    for k in ("model", "add_special_tokens"):
        if body.get(k) is not None:
            out[k] = body[k]
    return out


async def prompt_tokens(client: Any, url: str, kind: str, body: dict, headers: dict[str, str],
                        timeout_s: float) -> list[int] | None:
    """The prompt's token ids, from the engine at ``url`` when needed (``client``: an
    httpx.AsyncClient; ``headers``: the request's Authorization, if any).  Never raises for
    what the engine answers: None when it cannot say."""
    import httpx
    req = tokenize_body(kind, body)
    if req is None or isinstance(req, list):
        return req
    try:
        r = await client.post(url + "/tokenize", json=req, headers=headers, timeout=timeout_s)
    except httpx.HTTPError:
        return None
    if r.status_code != 200:
        return None
    try:
        return _ids(r.json().get("tokens"))
    except (ValueError, AttributeError):
        return None
