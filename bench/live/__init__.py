"""The live agent benchmark (``kvtier bench live``): an agent trace's sessions driven
through configurations of an in-process vLLM engine, repeated, compared.  The engine
(:mod:`kvtier.engine_adapter.vllm_inprocess`), the tiny local model
(:mod:`kvtier.engine_adapter.tiny_model`) and the scripted agent sessions
(:mod:`kvtier.engine_adapter.agent_sessions`) are the product's; ``kvtier demo --engine vllm``
and ``tests/live/`` use them too.  With ``--url`` the sessions go to a running
``vllm serve`` instead (:mod:`.url_bench`, over :mod:`.http_engine`, kvtier's
counters from its ``/metrics`` by :mod:`.server_metrics`)."""
