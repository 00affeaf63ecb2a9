"""The trickling remote: kvtier's Redis tier behind the rig's :class:`TrickleProxy` slows to a
trickle, so every value read (and, one time in two by the seed, written) takes far longer than
kvtier's remote deadline; recover forwards at full speed again.

kvtier must cut each such call at its deadline and answer a miss (its breaker trips, its probe's
tiny PING still passes, so it flaps between up and down while the fault lasts), and serve from
the remote again once the fault is recovered.  The engine's Redis URL must point at
``rig.redis_proxy.port``; the proxy outlives redis-server restarts.  Called from the faults
thread only, like every :class:`Fault`.
"""
from __future__ import annotations

import random

from kvtier.bench.soak_live.faults import Fault, FaultError
from kvtier.bench.soak_live.rig import Rig
from kvtier.bench.soak_live.trickle import TrickleProxy


def redis_proxy(rig: Rig) -> TrickleProxy:
    """The rig's proxy in front of redis-server.  Raises FaultError: the rig has none."""
    proxy = getattr(rig, "redis_proxy", None)
    if proxy is None:
        raise FaultError("the rig has no redis_proxy (a TrickleProxy in front of redis-server) "
                         "to make the remote trickle")
    return proxy


class RemoteTrickle(Fault):
    """Server->client bytes of kvtier's Redis connections trickle (client->server too when the
    seeded coin says so); recover forwards at full speed."""
    name = "remote-trickle"

    def inject(self, rig: Rig, rng: random.Random) -> str:
        proxy = redis_proxy(rig)
        upstream = rng.random() < 0.5
        proxy.trickle(True, upstream=upstream)
        ways = "both ways" if upstream else "server->client"
        return (f"redis proxy :{proxy.port} trickling {ways}, {proxy.chunk} B every {proxy.gap_s:g} s "
                f"per connection ({proxy.stats().open} open)")

    def recover(self, rig: Rig, rng: random.Random) -> str:
        proxy = redis_proxy(rig)
        proxy.trickle(False)
        st = proxy.stats()
        return (f"redis proxy :{proxy.port} at full speed again ({st.trickled_down} B trickled down, "
                f"{st.trickled_up} up so far)")
