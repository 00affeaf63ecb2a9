"""vLLM general plugin: registers ``KvtierConnector`` with vLLM's connector factory.

Installed as the ``kvtier`` entry point of the ``vllm.general_plugins`` group
(pyproject.toml), which vLLM loads in every process at start-up
(``vllm.plugins.load_general_plugins``), so
``--kv-transfer-config '{"kv_connector": "KvtierConnector", ...}'`` needs no
``kv_connector_module_path``.  Registration is lazy (nothing of kvtier's
vLLM tier is imported until the connector is created) and idempotent (vLLM
may load plugins more than once).
"""
from __future__ import annotations

CONNECTOR_NAME = "KvtierConnector"


def register() -> None:
    """Register ``KvtierConnector`` (module ``kvtier.engine_adapter.vllm``) unless it is already."""
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    try:
        KVConnectorFactory.register_connector(CONNECTOR_NAME, "kvtier.engine_adapter.vllm", CONNECTOR_NAME)
    except ValueError:   # "already registered": a second load in the same process
        pass
