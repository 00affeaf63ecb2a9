"""What decrypting a remote value costs, in place against through the bounce buffer.

``python -m kvtier.bench.gcm_bench [--sizes 64K 1M] [--repeat 41] [--json]``

``cryptography`` 51 refuses to decrypt a buffer into itself, so kvtier's GCM
(:mod:`kvtier.store.remote.gcm`) decrypts each value slice by slice through a
per-thread bounce buffer there and copies it back.  On a ``cryptography``
that still allows in place (43 to 50) both ways run here, interleaved in every
repeat, so the ratio bounced / in place is the bounce's cost on the same
machine at the same moment; on 51 and newer only the bounced way runs.  Also
timed in each repeat: encrypt and the tag, for scale.  Each figure is the
median over the repeats of the best of 5 calls.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys

import cryptography

from kvtier.bench.cmd_tiers import parse_size
from kvtier.bench.timing import best_of
from kvtier.store.remote.gcm import Gcm, decrypt_step, in_place_allowed


def measure(size: int, repeat: int) -> dict:
    key, nonce = bytes(range(32)), bytes(12)
    plain = bytearray(size)
    for off in range(0, size, 4096):
        plain[off] = off % 251
    ways = {"bounced": Gcm(key, decrypt_step(False))}
    if in_place_allowed():
        ways["in_place"] = Gcm(key, decrypt_step(True))
    g = ways["bounced"]
    ct = bytearray(size)
    tag = g.encrypt(nonce, b"KVTE", [plain], [ct])
    work = bytearray(size)

    def decrypt(way: Gcm) -> None:
        work[:] = ct                                   # untimed in the ratio: both ways pay it
        assert way.decrypt(nonce, b"KVTE", [work], tag)

    copy_only = []
    times: dict[str, list[float]] = {w: [] for w in ways}
    enc, tg = [], []
    out = bytearray(size)
    for _ in range(repeat):
        copy_only.append(best_of(lambda: work.__setitem__(slice(None), ct), 5))
        for name, way in ways.items():
            times[name].append(best_of(lambda: decrypt(way), 5))
        enc.append(best_of(lambda: g.encrypt(nonce, b"KVTE", [plain], [out]), 5))
        tg.append(best_of(lambda: g.tag(nonce, b"h" * 112, plain), 5))
    row = {"size": size, "repeat": repeat,
           "encrypt_us": 1e6 * statistics.median(enc), "tag_us": 1e6 * statistics.median(tg)}
    for name, ts in times.items():
        row[f"decrypt_{name}_us"] = 1e6 * statistics.median([t - c for t, c in zip(ts, copy_only)])
    if "in_place" in times:
        ratios = [(b - c) / (i - c) for b, i, c in zip(times["bounced"], times["in_place"], copy_only)]
        row["bounced_over_in_place_paired_median"] = statistics.median(ratios)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kvtier.bench.gcm_bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", nargs="+", type=parse_size, default=[64 << 10, 1 << 20])
    ap.add_argument("--repeat", type=int, default=41)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.repeat < 1:
        ap.error("--repeat must be at least 1")
    rows = [measure(s, a.repeat) for s in a.sizes]
    result = {"cryptography": cryptography.__version__, "in_place_allowed": in_place_allowed(), "rows": rows}
    if a.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"cryptography {result['cryptography']}, in place allowed: {result['in_place_allowed']}")
    for r in rows:
        cells = ", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in r.items())
        print(f"  {cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
