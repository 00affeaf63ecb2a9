"""Prefix health and prefix routing.

* :mod:`.chunks`: the chained chunk hash of figure 7 (``h_k = Hash(h_{k-1} || c_k)``).
* :mod:`.score`: the affinity-load objective ``mu*(Match/S) - (1-mu)*(L_j/L_max)**gamma``.
* :mod:`.directory`: which worker (and which medium) holds which chunk hash, fed by
  KV events in vLLM's schema (``kvtier.store.events`` or the engine's own).
* :mod:`.doctor`: the harness log doctor (equation (2)'s hit rate, what broke the prefix;
  :mod:`.causes` names the cause, :mod:`.volatile` the volatile values of a changed head).

No torch, no store imports: events are read by their fields.
"""
