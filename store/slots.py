"""Free-slot map of the NVMe tier: sorted, merged extents of free slots.

``alloc(n)`` is first-fit on the lowest extent that holds ``n`` slots, so a
batch (a trajectory's blocks) gets one contiguous run whenever one exists and
I/O coalesces; otherwise it takes the lowest free slots piecewise.  ``free``
merges neighbours and raises on a double free.  Not thread-safe by itself.
"""
from __future__ import annotations

import bisect
from typing import Iterable

from .errors import StoreError


def runs_of(slots: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted slots -> [(start, count)] of consecutive runs."""
    out: list[tuple[int, int]] = []
    for s in sorted(slots):
        if out and out[-1][0] + out[-1][1] == s:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((s, 1))
    return out


class SlotAllocator:
    def __init__(self, total: int, used: Iterable[int] = ()) -> None:
        self.total = total
        self._starts: list[int] = []
        self._len: dict[int, int] = {}
        self.free_count = 0
        prev = 0
        for s in sorted(set(used)):
            if s >= total:
                continue
            if s > prev:
                self._add(prev, s - prev)
            prev = s + 1
        if total > prev:
            self._add(prev, total - prev)

    @classmethod
    def free_above(cls, total: int, start: int) -> "SlotAllocator":
        """An allocator whose only free slots are ``[start, total)`` (no walk)."""
        a = cls(0)
        a.total = total
        if total > start:
            a._add(start, total - start)
        return a

    def free_runs(self, runs: Iterable[tuple[int, int]]) -> None:
        """Return slots given as (start, count) runs; as ``free`` (no per-slot work)."""
        for start, n in runs:
            self._free_extent(start, n)

    def _free_extent(self, start: int, n: int) -> None:
        if start < 0 or start + n > self.total:
            raise StoreError(f"free of slots {start}..{start + n - 1} outside 0..{self.total - 1}")
        i = bisect.bisect_right(self._starts, start)
        if i > 0:
            p = self._starts[i - 1]
            if p + self._len[p] > start:
                raise StoreError(f"double free of NVMe slot {start}")
        if i < len(self._starts) and self._starts[i] < start + n:
            raise StoreError(f"double free of NVMe slot {self._starts[i]}")
        # merge with predecessor / successor
        if i > 0 and (p := self._starts[i - 1]) + self._len[p] == start:
            self._len[p] += n
            s0 = p
        else:
            self._starts.insert(i, start)
            self._len[start] = n
            s0 = start
            i += 1
        if i < len(self._starts) and self._starts[i] == start + n:
            nxt = self._starts.pop(i)
            self._len[s0] += self._len.pop(nxt)
        self.free_count += n

    def _add(self, start: int, n: int) -> None:
        bisect.insort(self._starts, start)
        self._len[start] = n
        self.free_count += n

    def alloc(self, n: int) -> list[int] | None:
        """``n`` free slots (contiguous when possible) or ``None`` if fewer are free."""
        if n <= 0:
            return []
        if n > self.free_count:
            return None
        for i, s in enumerate(self._starts):
            ln = self._len[s]
            if ln >= n:
                self._take(i, s, ln, n)
                return list(range(s, s + n))
        out: list[int] = []
        while len(out) < n:  # fragmented: lowest extents first
            s = self._starts[0]
            take = min(self._len[s], n - len(out))
            self._take(0, s, self._len[s], take)
            out.extend(range(s, s + take))
        return out

    def _take(self, i: int, s: int, ln: int, n: int) -> None:
        del self._starts[i]
        del self._len[s]
        if ln > n:
            self._starts.insert(i, s + n)
            self._len[s + n] = ln - n
        self.free_count -= n

    def free(self, slots: Iterable[int]) -> None:
        """Return slots.  Raises ``StoreError`` on a double free or an out-of-range slot."""
        for start, n in runs_of(slots):
            self._free_extent(start, n)

    def cap(self, new_total: int) -> None:
        """Shrink capacity to ``new_total``: free slots at or beyond it disappear.
        Slots in use beyond it are the caller's to free first."""
        keep_starts = []
        for s in self._starts:
            ln = self._len[s]
            if s >= new_total:
                self.free_count -= ln
                del self._len[s]
            else:
                if s + ln > new_total:
                    self.free_count -= s + ln - new_total
                    self._len[s] = new_total - s
                keep_starts.append(s)
        self._starts = keep_starts
        self.total = min(self.total, new_total)

    def grow(self, new_total: int) -> None:
        """Raise capacity to ``new_total`` (undoes :meth:`cap`): slots ``[total, new_total)``
        become free.  No-op if ``new_total`` is not larger."""
        if new_total > self.total:
            old, self.total = self.total, new_total
            self._free_extent(old, new_total - old)

    def extents(self) -> list[tuple[int, int]]:
        return [(s, self._len[s]) for s in self._starts]
