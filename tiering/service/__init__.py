"""kvtier's HTTP control plane (``kvtier serve``): tool-wait forecasts, pause
decisions and the paused-trajectory registry, persisted in LMDB.

The package imports nothing, so importing one of its modules pulls in only what
that module needs (FastAPI only with :mod:`.app`):

* :mod:`.app`: ``create_app``, ``ServiceConfig`` (the FastAPI application);
* :mod:`.state`: ``ServiceState``, ``StateConfig`` (the registry and the policy behind it);
* :mod:`.server`: ``ServiceServer`` (uvicorn on a thread, for tests and embedding);
* :mod:`.models`, :mod:`.security`, :mod:`.metrics`, :mod:`.prefix_api`.
"""
