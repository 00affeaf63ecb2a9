"""``kvtier route``: an OpenAI-compatible router in front of engines, placing each request by
figure 7's prefix-load score with the match read from the engines' own KV event streams.

::

    engines' ZMQ PUB ──> subscriber (one thread) ──> BlockDirectory (hash -> engine -> medium)
    engines' /metrics ──> EnginePool (polled: up/down, waiting + running)
    client ──> proxy ──/tokenize──> block hashes (vLLM's) ──> Router.choose ──> engine
                                                      (the answer streams back as it comes)

The package imports nothing; each module pulls in only what it needs (pyzmq in
:mod:`.subscriber`, msgspec in :mod:`.events`, httpx in :mod:`.proxy` and :mod:`.pool`).

* :mod:`.hashing`: vLLM's prefix-cache block hashes (``BlockHasher``), in the 64-bit form events carry;
* :mod:`.events`: vLLM's KV event schema decoded from a ZMQ frame (``decode_frame``);
* :mod:`.subscriber`: ``EventSubscriber``, one SUB socket per engine, polled by one thread;
* :mod:`.weights`: ``TierWeights``, what a hit on each medium saves, priced by kvtier's cost model;
* :mod:`.directory`: ``BlockDirectory``, which engine holds which block hash on which medium;
* :mod:`.pool`: ``EnginePool``, each engine's URL, health and queue;
* :mod:`.router`: ``Router.choose``, the seed's score over the directory and the pool;
* :mod:`.tokens`: a request's prompt tokens, from the engine's own ``/tokenize``;
* :mod:`.policies`: the routing rules (prefix-load, round-robin, least-loaded, sticky);
* :mod:`.config`: ``RouterConfig`` and ``EngineSpec`` (``URL[=ZMQ_ENDPOINT]``);
* :mod:`.conversation`: ``ConversationTap``, kvtier's hints from a chat's tool calls, and the retag;
* :mod:`.proxy`: ``RouterApp``, the ASGI proxy.
"""
