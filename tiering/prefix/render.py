"""A chat-completions request as the token sequence an engine would prefill.

Layout (the common chat-template order: leading system messages, then the tool
definitions, then the conversation)::

    <|system|> messages[0].content           (each leading system message)
    <|tools|>  tools[0] tools[1] ...         (JSON as sent: key order kept)
    <|user|>   messages[1].content
    <|assistant|> messages[2].content messages[2].tool_calls
    <|tool|>   messages[3].content ...

Each piece is a :class:`Segment` labelled with the message and field it comes
from, tokenized on its own, so the first differing token names its field.
JSON is rendered as the harness sent it (``json.dumps`` in the given key
order), which is what makes nondeterministic serialization visible.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable, Mapping, Protocol, Sequence


class Tokenizer(Protocol):
    name: str

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids``.  Raises ValueError when they are not this tokenizer's ids."""
        ...


class ByteTokenizer:
    """One token per UTF-8 byte: the fallback when no tokenizer is given."""

    name = "bytes"

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(ids).decode("utf-8")      # ValueError: an id past 255, or not UTF-8


class FileTokenizer:
    """A ``tokenizers`` tokenizer read from a local ``tokenizer.json`` (or a folder holding one).
    Raises ValueError if the file cannot be read, ImportError without ``tokenizers``."""

    def __init__(self, path: str) -> None:
        from pathlib import Path
        from tokenizers import Tokenizer as _T
        p = Path(path)
        if p.is_dir():
            p = p / "tokenizer.json"
        try:
            self._tok = _T.from_file(str(p))
        except Exception as exc:
            raise ValueError(f"cannot read a tokenizer from {p}: {exc}") from None
        self.name = str(p)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        if any(not 0 <= i < self._tok.get_vocab_size(with_added_tokens=True) for i in ids):
            raise ValueError(f"a token id is outside {self.name}'s vocabulary")
        return self._tok.decode(list(ids), skip_special_tokens=False)


def load_tokenizer(path: str | None) -> Tokenizer:
    """``path``: a local tokenizer.json (or its folder); None: the byte-level fallback."""
    return ByteTokenizer() if path is None else FileTokenizer(path)


@dataclass(frozen=True)
class Segment:
    """One field of the request: its label (``messages[3].content``, ``tools[1]``) and text."""

    label: str
    text: str


def _dump(obj) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def _content(c) -> str:
    if c is None:
        return ""
    if isinstance(c, str):
        return c
    if isinstance(c, list):              # content parts
        return "".join(p.get("text", "") if isinstance(p, Mapping) and "text" in p else _dump(p) for p in c)
    return _dump(c)


def segments(request: Mapping) -> list[Segment]:
    """The request's fields in prefill order.  Raises ValueError when ``messages`` is not a
    list of objects with a role, or ``tools`` is not a list."""
    msgs = request.get("messages")
    if not isinstance(msgs, list) or not all(isinstance(m, Mapping) and isinstance(m.get("role"), str)
                                             for m in msgs):
        raise ValueError("request.messages must be a list of objects with a string 'role'")
    tools = request.get("tools") or []
    if not isinstance(tools, list):
        raise ValueError("request.tools must be a list")
    out: list[Segment] = []
    i = 0
    while i < len(msgs) and msgs[i]["role"] in ("system", "developer"):
        out.append(Segment(f"messages[{i}].role", f"<|{msgs[i]['role']}|>\n"))
        out.append(Segment(f"messages[{i}].content", _content(msgs[i].get("content")) + "\n"))
        i += 1
    if tools:
        out.append(Segment("tools", "<|tools|>\n"))
        out.extend(Segment(f"tools[{j}]", _dump(t) + "\n") for j, t in enumerate(tools))
    for k in range(i, len(msgs)):
        m = msgs[k]
        out.append(Segment(f"messages[{k}].role", f"<|{m['role']}|>\n"))
        out.append(Segment(f"messages[{k}].content", _content(m.get("content")) + "\n"))
        if m.get("tool_calls"):
            out.append(Segment(f"messages[{k}].tool_calls", _dump(m["tool_calls"]) + "\n"))
    return out


@dataclass(frozen=True)
class Rendered:
    """Token ids of a prompt, and the label of the segment each token came from."""

    tokens: tuple[int, ...]
    starts: tuple[int, ...]          # first token index of each segment
    labels: tuple[str, ...]

    def label_at(self, pos: int) -> str | None:
        """The field token ``pos`` falls in (None past the end)."""
        if pos >= len(self.tokens) or not self.starts:
            return None
        import bisect
        return self.labels[bisect.bisect_right(self.starts, pos) - 1]


def render(request: Mapping, tok: Tokenizer) -> Rendered:
    toks: list[int] = []
    starts, labels = [], []
    for s in segments(request):
        ids = tok.encode(s.text)
        if not ids:
            continue
        starts.append(len(toks))
        labels.append(s.label)
        toks.extend(ids)
    return Rendered(tuple(toks), tuple(starts), tuple(labels))


def render_tokens(tokens: Sequence[int]) -> Rendered:
    """A log line that gives token ids directly: one segment, ``tokens``."""
    return Rendered(tuple(int(t) for t in tokens), (0,) if tokens else (), ("tokens",) if tokens else ())
