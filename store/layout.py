"""The data directory's format marker: ``<root>/FORMAT``.

    <root>/FORMAT       "kvtier store format 2", then the layout as one JSON line
                        (block/slot bytes, slots per slab: what tools need to
                        read the slabs when the index is gone)
    <root>/LOCK         flock of the open store
    <root>/OPEN         boot id of the open store (store/unclean.py): a restart -> rebuild
    <root>/slabs/       slab files of self-describing slots (store/nvme.py)
    <root>/index/       LMDB index (store/index.py), derivable from the slabs
    <root>/index.corrupt-<time>/   a damaged index set aside by a rebuild

Format 1 (kvtier <= 0.2) had no marker and slots without headers: its slabs
cannot be told apart from empty slots, so such a directory is refused with
``OldLayout`` (one line saying what to do) -- never misread, never rebuilt
into an empty store.  KV blocks are recomputable, so there is no migration:
the operator moves the directory aside (or deletes it) and the engine refills
a new one.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from .durable import write_durably
from .errors import ConfigMismatch, OldLayout, StoreError

FORMAT_FILE = "FORMAT"
FORMAT_VERSION = 2
_LINE = "kvtier store format {}\n"


def _has_old_data(root: Path) -> bool:
    slabs = root / "slabs"
    return (root / "index" / "data.mdb").exists() or (slabs.is_dir() and any(slabs.glob("slab-*.kv")))


def read_layout(root: Path) -> dict | None:
    """The layout a format-2 marker records, or None (no marker, or none recorded)."""
    try:
        lines = (Path(root) / FORMAT_FILE).read_bytes().decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    try:
        got = json.loads(lines[1]) if len(lines) > 1 else None
    except ValueError:
        return None
    return got if isinstance(got, dict) else None


def check_format(root: Path, layout: dict | None = None) -> None:
    """Accept a directory of this format, stamp a new one (with ``layout``),
    refuse anything else.

    Raises ``OldLayout`` for a format-1 directory (data but no marker) or a
    marker naming another version, ``ConfigMismatch`` if the recorded layout
    differs from ``layout``; ``StoreError`` if the marker cannot be written."""
    marker = root / FORMAT_FILE
    try:
        text = marker.read_bytes().decode("utf-8", "replace")   # damaged bytes: a marker that does not match
    except FileNotFoundError:
        if _has_old_data(root):
            raise OldLayout(
                f"{root} holds kvtier data but no {FORMAT_FILE} marker: a store of format 1 (slots without "
                f"headers) or one whose marker was deleted; this kvtier reads "
                f"format {FORMAT_VERSION}: move the directory aside or delete it (its KV blocks are "
                f"recomputable) and open again") from None
        _stamp(root, layout)
        return
    except OSError as exc:
        raise StoreError(f"{marker}: cannot read the format marker: {exc.strerror}") from None
    first = text.split("\n", 1)[0] + "\n"
    if first != _LINE.format(FORMAT_VERSION):
        if re.fullmatch(r"kvtier store format \d{1,6}\n", first) is None:
            raise OldLayout(f"{marker} is damaged (it starts {first[:48]!r}, not 'kvtier store format N'): "
                            f"move the directory aside or delete it (its KV blocks are recomputable) and open again")
        raise OldLayout(f"{marker} says {first.strip()!r}; this kvtier reads format {FORMAT_VERSION}: "
                        f"use the kvtier that wrote it, or move the directory aside")
    old = read_layout(root)
    if layout is not None and old is not None and old != layout:
        diff = ", ".join(f"{k}: stored {old.get(k)} vs config {v}" for k, v in layout.items() if old.get(k) != v)
        raise ConfigMismatch(f"store root was created with another layout ({diff})")


def _stamp(root: Path, layout: dict | None) -> None:
    text = _LINE.format(FORMAT_VERSION)
    if layout is not None:
        text += json.dumps(layout, sort_keys=True) + "\n"
    try:
        write_durably(root / FORMAT_FILE, text)
    except OSError as exc:
        raise StoreError(f"{root}: cannot write the format marker: {exc.strerror}") from None
