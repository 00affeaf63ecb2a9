"""``kvtier bench tiers --remote URL``: the remote tier beside its raw client, same bytes, same run.

kvtier side: ``RemoteTier.publish`` / ``fetch`` -- record header, xxh3,
domain-keyed names, verification on read, the circuit breaker -- as
``TieredStore.put_many(tier="remote")`` and ``stage_from_remote`` (the
engines' ``prepare_load`` path) run them: the destination buffers are lent
to the fetch (``Loan``) the way the store lends the host frames it stages
into, so a zero-copy backend may read straight into them.  Raw side, on the
same server and the same page-aligned buffers:

* Redis / Redis Cluster: a redis-py pipeline (``transaction=False``) of
  ``SET name payload`` / ``GET name`` (the values come back as bytes objects,
  nothing verified, nothing copied into the destination buffers);
* Mooncake: ``batch_put_from`` / ``batch_get_into`` on the same client,
  with the source and destination memory ``register_buffer``-ed.

Beside the unkeyed tier, two keyed ones on the same backend, same bytes,
same repeats: ``mac_put`` / ``mac_get`` (values authenticated with a key)
and ``enc_put`` / ``enc_get`` (values encrypted, ``encrypt=True``); per row
``mac_*_slowdown_paired_median`` / ``enc_*_slowdown_paired_median`` is the
median over repeats of keyed time / unkeyed time (> 1: slower), and the
section's ``mac_*_cost`` / ``enc_*_cost`` are 1 - keyed GB/s / unkeyed GB/s
over every size (best of repeats).

Every repeat measures raw put, kvtier put, raw get, kvtier get back to back
(noise hits all alike; odd repeats run kvtier first) on fresh names, deleted
afterwards (untimed): a
Mooncake put of an existing name would move nothing.  The best of
``repeat`` is kept, as for the other tiers; the median is reported too, and
per row ``*_vs_raw_paired_median``: the median over repeats of raw time /
kvtier time of the same repeat (the two calls ran back to back), and
``*_cpu_ms``: this process's CPU time per call (all its threads; median).

Mooncake rows also carry a third measurement, ``fmt_put`` / ``fmt_get``: the
same raw calls moving kvtier's value layout (header + payload values from a
registered arena below 512 KiB, ``[header, payload]`` multi-buffer requests
from it; nothing copied, nothing hashed).  It splits the gap in two:
``*_format_vs_raw_paired_median`` (what a 112-byte header on every value
costs the transport) and ``*_vs_format_paired_median`` (what the tier's own
work -- copy, xxh3, header checks, names, Python -- adds on top).

And a fourth, ``polite_put`` / ``polite_get``: the raw calls (bare values)
made the way the tier makes its calls, from a worker thread at lowered
priority (``store/remote/calls.py``: Mooncake's client spins while it waits,
and a spinner at normal priority competes with the transfer threads).
``*_vs_polite_paired_median`` is the tier against the raw client given the
same way of waiting: what the tier's work costs once the wait is polite.
"""
from __future__ import annotations

import ctypes
import statistics
import time

MIB = 1 << 20
REMOTE_MAX_BYTES = 64 * MIB       # per measurement: what a small test server holds comfortably


def remote_url_arg(text: str) -> str:
    """argparse type for ``--remote``: the URL if it parses (checked before any measurement)."""
    import argparse

    from kvtier.store.remote import BadRemoteURL, parse_remote_url
    try:
        parse_remote_url(text)
    except BadRemoteURL as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9 if seconds > 0 else float("inf")


class _RawRedis:
    """redis-py pipelines on the URL's server or cluster (the raw client)."""

    def __init__(self, spec) -> None:
        import redis
        kw = dict(username=spec.username, password=spec.password, socket_timeout=10)
        if spec.kind == "redis-cluster":
            from redis.cluster import ClusterNode, RedisCluster
            self.c = RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in spec.hosts], **kw)
        elif spec.unix_path:
            self.c = redis.Redis(unix_socket_path=spec.unix_path, db=spec.db, **kw)
        else:
            (h, p), = spec.hosts
            self.c = redis.Redis(host=h, port=p, db=spec.db, ssl=spec.tls, **kw)

    def put(self, names, bufs) -> None:
        p = self.c.pipeline(transaction=False)
        for n, b in zip(names, bufs):
            p.set(n, b)
        if not all(p.execute()):
            raise RuntimeError("raw redis SET failed")

    def get(self, names, bufs) -> None:
        p = self.c.pipeline(transaction=False)
        for n in names:
            p.get(n)
        if any(v is None for v in p.execute()):
            raise RuntimeError("raw redis GET missed")

    def delete(self, names) -> None:
        p = self.c.pipeline(transaction=False)
        for n in names:
            p.unlink(n)
        p.execute()

    def close(self) -> None:
        self.c.close()


class _RawMooncake:
    """Mooncake's batch calls on kvtier's own (registered) client."""

    def __init__(self, backend) -> None:
        from kvtier.store.hostpool import buffer_address
        self.mc = backend._connect()
        self.addr = buffer_address
        self._stage = None                     # the format baseline's registered arena (lazily)
        self._polite = None                    # the polite baseline's worker (lazily)

    def put(self, names, bufs) -> None:
        codes = self.mc.batch_put_from([n.decode() for n in names], [self.addr(b) for b in bufs],
                                       [b.nbytes for b in bufs])
        if any(codes):
            raise RuntimeError(f"raw mooncake batch_put_from failed: {sorted(set(codes))}")

    def get(self, names, bufs) -> None:
        codes = self.mc.batch_get_into([n.decode() for n in names], [self.addr(b) for b in bufs],
                                       [b.nbytes for b in bufs])
        if any(c != b.nbytes for c, b in zip(codes, bufs)):
            raise RuntimeError(f"raw mooncake batch_get_into failed: {sorted(set(codes))}")

    # -- the format baseline: the same raw calls moving kvtier's value layout
    def _layout(self, bufs):
        """The calls' buffers as the tier's backend lays values out (store/remote/
        mooncake_backend.py): below ``SMALL_VALUE`` one request per value of header +
        payload in a registered arena; from it [header, payload] (the payload
        zero-copy).  Nothing is copied or hashed: this is what the value format
        alone costs the transport."""
        from kvtier.store.aligned import AlignedBuffer
        from kvtier.store.record import HEADER_BYTES as hn
        from kvtier.store.remote.mooncake_backend import SMALL_VALUE
        bn, n = bufs[0].nbytes, len(bufs)
        small = hn + bn < SMALL_VALUE
        need = n * (hn + bn) if small else n * hn
        if self._stage is None or self._stage.nbytes < need:
            self.close()
            self._stage = AlignedBuffer(need)
            self._stage.address = self.addr(self._stage.view())
            ctypes.memset(self._stage.address, 1, self._stage.nbytes)     # fault it in before timing
            self.mc.register_buffer(self._stage.address, self._stage.nbytes)
        base = self._stage.address
        if small:
            return False, [base + i * (hn + bn) for i in range(n)], [hn + bn] * n
        return True, [[base + i * hn, self.addr(b)] for i, b in enumerate(bufs)], [[hn, bn]] * n

    def put_format(self, names, bufs) -> None:
        multi, ptrs, sizes = self._layout(bufs)
        call = self.mc.batch_put_from_multi_buffers if multi else self.mc.batch_put_from
        codes = call([n.decode() for n in names], ptrs, sizes)
        if any(codes):
            raise RuntimeError(f"raw mooncake format put failed: {sorted(set(codes))}")

    def get_format(self, names, bufs) -> None:
        multi, ptrs, sizes = self._layout(bufs)
        call = self.mc.batch_get_into_multi_buffers if multi else self.mc.batch_get_into
        codes = call([n.decode() for n in names], ptrs, sizes)
        want = sum(sizes[0]) if multi else sizes[0]
        if any(c != want for c in codes):
            raise RuntimeError(f"raw mooncake format get failed: {sorted(set(codes))}")

    # -- the polite baseline: the same bare calls, waited for as the tier waits
    def _worker(self):
        if self._polite is None:
            from concurrent.futures import ThreadPoolExecutor

            from kvtier.store.remote.calls import WAITER_NICE, lower_own_priority
            self._polite = ThreadPoolExecutor(1, initializer=lower_own_priority, initargs=(WAITER_NICE,))
        return self._polite

    def put_polite(self, names, bufs) -> None:
        self._worker().submit(self.put, names, bufs).result()

    def get_polite(self, names, bufs) -> None:
        self._worker().submit(self.get, names, bufs).result()

    def delete(self, names) -> None:
        self.mc.batch_remove([n.decode() for n in names], True)

    def close(self) -> None:
        if self._polite is not None:
            self._polite.shutdown()
            self._polite = None
        if self._stage is not None:
            self.mc.unregister_buffer(self._stage.address)
            self._stage.close()
            self._stage = None


def remote_section(url: str, sizes, total: int, repeat: int, src, dst, tick=lambda: None) -> dict:
    """Measure the remote tier at ``url`` for each block size (see the module
    docstring).  ``src``/``dst``: the benchmark's page-aligned buffers
    (``.mv``, ``.addr``, ``.blocks(size)``).  Returns the JSON section.
    Raises ``ValueError`` for a bad URL or a server not up within 15 s, and
    ``RuntimeError`` if it returns wrong bytes."""
    from kvtier.store.remote import RemoteTier, make_backend, parse_remote_url
    spec = parse_remote_url(url)
    total = min(total, REMOTE_MAX_BYTES)
    backend = make_backend(spec)                 # one client for every size (and the raw side)
    rows = []
    try:
        for size in sizes:
            tier = RemoteTier(backend, size, url=spec.redacted())
            keyed = RemoteTier(backend, size, url=spec.redacted(), secret=MAC_BENCH_KEY)
            enc = RemoteTier(backend, size, url=spec.redacted(), secret=MAC_BENCH_KEY, encrypt=True)
            try:
                for t in (tier, keyed, enc):     # each tier connects on its own: all three before timing
                    if not t.wait_ready(15):
                        raise ValueError(f"--remote {spec.redacted()} not reachable in 15 s: {t.stats().last_error}")
                if not rows:
                    tier.register(src.addr, len(src.mm))
                    tier.register(dst.addr, len(dst.mm))
                raw = _RawMooncake(backend) if spec.kind == "mooncake" else _RawRedis(spec)
                try:
                    rows.append(_one_size(tier, raw, size, max(1, total // size), repeat, src, dst, keyed, enc))
                finally:
                    raw.close()
            finally:
                for t in (tier, keyed, enc):
                    t.close(backend=False)
            tick()
    finally:
        backend.close()
    nb = sum(r["bytes"] for r in rows)
    agg = lambda col: nb / sum(r["bytes"] / r[col] for r in rows)  # noqa: E731
    put, get, rput, rget = agg("put_gbps"), agg("get_gbps"), agg("raw_put_gbps"), agg("raw_get_gbps")
    raw_name = "Mooncake batch_put_from/batch_get_into" if spec.kind == "mooncake" else "redis-py pipeline SET/GET"
    sec = {"url": spec.redacted(), "backend": spec.kind, "put_gbps": put, "get_gbps": get,
           "raw_put_gbps": rput, "raw_get_gbps": rget, "put_vs_raw": put / rput, "get_vs_raw": get / rget,
           "raw_client": raw_name, "rows": rows,
           "api": "RemoteTier.publish/fetch (header + xxh3 + verification) vs the raw client on the same bytes"}
    if rows:   # the MAC's cost: the keyed tier (sealed values) against the unkeyed one, same run
        mput, mget = agg("mac_put_gbps"), agg("mac_get_gbps")
        sec.update(mac_put_gbps=mput, mac_get_gbps=mget, mac_put_cost=1 - mput / put, mac_get_cost=1 - mget / get)
        eput, eget = agg("enc_put_gbps"), agg("enc_get_gbps")
        sec.update(enc_put_gbps=eput, enc_get_gbps=eget, enc_put_cost=1 - eput / put, enc_get_cost=1 - eget / get)
    if rows and "fmt_put_gbps" in rows[0]:
        fput, fget = agg("fmt_put_gbps"), agg("fmt_get_gbps")
        sec.update(fmt_put_gbps=fput, fmt_get_gbps=fget, put_format_vs_raw=fput / rput,
                   get_format_vs_raw=fget / rget, put_vs_format=put / fput, get_vs_format=get / fget)
        pput, pget = agg("polite_put_gbps"), agg("polite_get_gbps")
        sec.update(polite_put_gbps=pput, polite_get_gbps=pget, put_vs_polite=put / pput, get_vs_polite=get / pget)
    return sec


MAC_BENCH_KEY = b"kvtier bench key: not a secret, only a MAC measurement"


def _one_size(tier, raw, size: int, n: int, repeat: int, src, dst, keyed=None, enc=None) -> dict:
    from kvtier.store.remote.arenas import Loan
    loan = Loan()              # dst outlives the run: nothing to give back, only abandoned calls to count
    sb, db = src.blocks(size)[:n], dst.blocks(size)[:n]
    nbytes = n * size
    keys = [b"bench-%d-%d" % (size, i) for i in range(n)]
    fmt = hasattr(raw, "put_format")         # Mooncake: also the raw calls moving kvtier's value layout
    cols = ("raw_put", "put", "raw_get", "get") + (("fmt_put", "fmt_get", "polite_put", "polite_get") if fmt else ()) \
        + (("mac_put", "mac_get") if keyed is not None else ()) + (("enc_put", "enc_get") if enc is not None else ())
    t = {k: [] for k in cols}
    cpu = {k: [] for k in cols}
    for r in range(repeat):
        raw_names = [b"kvtier-raw:%d:%d:%d" % (size, r, i) for i in range(n)]
        fmt_names = [b"kvtier-fmt:%d:%d:%d" % (size, r, i) for i in range(n)]
        pol_names = [b"kvtier-pol:%d:%d:%d" % (size, r, i) for i in range(n)]
        ks = [k + b"-%d" % r for k in keys]

        def timed(col, fn):
            c0, t0 = time.process_time(), time.perf_counter()
            fn()
            t[col].append(time.perf_counter() - t0)
            cpu[col].append(time.process_time() - c0)
        puts = [("raw_put", lambda: raw.put(raw_names, sb)),
                ("put", lambda: _published(tier, ks, sb, "publish"))]
        gets = [("raw_get", lambda: raw.get(raw_names, db)),
                ("get", lambda: _check(all(tier.fetch(ks, db, loan=loan)), "fetch missed"))]
        if keyed is not None:
            mks = [k + b"-mac" for k in ks]
            puts.append(("mac_put", lambda: _published(keyed, mks, sb, "keyed publish")))
            gets.append(("mac_get", lambda: _check(all(keyed.fetch(mks, db, loan=loan)), "keyed fetch missed")))
        if enc is not None:
            eks = [k + b"-enc" for k in ks]
            puts.append(("enc_put", lambda: _published(enc, eks, sb, "encrypting publish")))
            gets.append(("enc_get", lambda: _check(all(enc.fetch(eks, db, loan=loan)), "encrypted fetch missed")))
        if fmt:
            puts[1:1] = [("fmt_put", lambda: raw.put_format(fmt_names, sb)),
                         ("polite_put", lambda: raw.put_polite(pol_names, sb))]
            gets[1:1] = [("fmt_get", lambda: raw.get_format(fmt_names, db)),
                         ("polite_get", lambda: raw.get_polite(pol_names, db))]
        if r % 2:                      # alternate who goes first (a fuller server, a warmer cache)
            puts.reverse()
            gets.reverse()
        for col, fn in puts + gets:
            timed(col, fn)
        if bytes(db[-1]) != bytes(sb[-1]):
            raise RuntimeError("remote tier returned wrong bytes")
        raw.delete(raw_names + (fmt_names + pol_names if fmt else []))
        tier.drop(ks)
        if keyed is not None:
            keyed.drop(mks)
        if enc is not None:
            enc.drop(eks)
    best = {k: min(v) for k, v in t.items()}
    med = {k: statistics.median(v) for k, v in t.items()}
    row = dict(block_bytes=size, bytes=nbytes, blocks=n)
    for col in t:
        row[f"{col}_gbps"] = _gbps(nbytes, best[col])
        row[f"{col}_median_gbps"] = _gbps(nbytes, med[col])
        row[f"{col}_cpu_ms"] = statistics.median(cpu[col]) * 1e3   # this process, all its threads
    row["put_vs_raw"] = row["put_gbps"] / row["raw_put_gbps"]
    row["get_vs_raw"] = row["get_gbps"] / row["raw_get_gbps"]
    # paired: each repeat's raw and kvtier calls ran back to back, so their
    # ratio shares that moment's load; the median of those is steadier on a
    # shared machine than the ratio of two independent bests
    pair = lambda a, b: statistics.median(x / y for x, y in zip(t[a], t[b]))  # noqa: E731
    for op in ("put", "get"):
        row[f"{op}_vs_raw_paired_median"] = pair(f"raw_{op}", op)
        if keyed is not None:     # > 1: the MAC makes the call slower by that factor
            row[f"mac_{op}_slowdown_paired_median"] = pair(f"mac_{op}", op)
        if enc is not None:       # > 1: encryption (vs no key) makes the call slower by that factor
            row[f"enc_{op}_slowdown_paired_median"] = pair(f"enc_{op}", op)
        row[f"{op}_cpu_vs_raw"] = row[f"raw_{op}_cpu_ms"] / row[f"{op}_cpu_ms"]
        if fmt:   # the split: what the value format costs the transport, and what the tier adds to that
            row[f"{op}_format_vs_raw_paired_median"] = pair(f"raw_{op}", f"fmt_{op}")
            row[f"{op}_vs_format_paired_median"] = pair(f"fmt_{op}", op)
            row[f"{op}_vs_polite_paired_median"] = pair(f"polite_{op}", op)
    return row


def _published(tier, keys, bufs, what: str) -> None:
    """``tier.publish``; raises ``RuntimeError`` with the tier's last error if
    the server refused a block."""
    n = tier.publish(keys, bufs)
    if n != len(keys):
        s = tier.stats()
        raise RuntimeError(f"remote tier: {what} stored {n} of {len(keys)} blocks "
                           f"(state {s.state}, last error {s.last_error})")


def _check(ok: bool, what: str) -> None:
    if not ok:
        raise RuntimeError(f"remote tier: {what}")


def print_remote(con, sec: dict) -> None:
    """The readable table of the section."""
    from rich.table import Table
    fmt = "fmt_put_gbps" in sec
    t = Table(title=f"remote tier {sec['url']} vs raw client ({sec['raw_client']}), same bytes, same run")
    heads = ["block", "put GB/s", "raw put", "put/raw", "paired", "get GB/s", "raw get", "get/raw", "paired"]
    if fmt:
        heads += ["format/raw put", "format/raw get", "put/polite", "get/polite"]
    for c in heads:
        t.add_column(c, justify="right")
    for r in sec["rows"]:
        size = r["block_bytes"]
        cells = [f"{size // MIB} MiB" if size >= MIB else f"{size >> 10} KiB", f"{r['put_gbps']:.2f}",
                 f"{r['raw_put_gbps']:.2f}", f"{r['put_vs_raw']:.2f}x", f"{r['put_vs_raw_paired_median']:.2f}x",
                 f"{r['get_gbps']:.2f}", f"{r['raw_get_gbps']:.2f}", f"{r['get_vs_raw']:.2f}x",
                 f"{r['get_vs_raw_paired_median']:.2f}x"]
        if fmt:
            cells += [f"{r[f'{c}_paired_median']:.2f}x" for c in
                      ("put_format_vs_raw", "get_format_vs_raw", "put_vs_polite", "get_vs_polite")]
        t.add_row(*cells)
    last = ["all", f"{sec['put_gbps']:.2f}", f"{sec['raw_put_gbps']:.2f}", f"{sec['put_vs_raw']:.2f}x", "",
            f"{sec['get_gbps']:.2f}", f"{sec['raw_get_gbps']:.2f}", f"{sec['get_vs_raw']:.2f}x", ""]
    if fmt:
        last += [f"{sec[c]:.2f}x" for c in ("put_format_vs_raw", "get_format_vs_raw", "put_vs_polite", "get_vs_polite")]
    t.add_row(*last, style="bold")
    con.print(t)
    if sec["rows"] and "mac_put_slowdown_paired_median" in sec["rows"][0]:
        for r in sec["rows"]:
            size = r["block_bytes"]
            con.print(f"{size // MIB} MiB" if size >= MIB else f"{size >> 10} KiB",
                      "keyed vs no key (paired medians): MAC put "
                      f"{r['mac_put_slowdown_paired_median']:.3f}x, get {r['mac_get_slowdown_paired_median']:.3f}x; "
                      f"encrypted put {r['enc_put_slowdown_paired_median']:.3f}x, "
                      f"get {r['enc_get_slowdown_paired_median']:.3f}x", highlight=False)
