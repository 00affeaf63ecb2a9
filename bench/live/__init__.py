"""Live-engine runs: a tiny local model, an in-process vLLM engine with kvtier's
connector, and the agent sessions that drive it (``kvtier demo --engine vllm``,
``kvtier bench live``, ``tests/live/``)."""
