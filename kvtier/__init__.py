"""kvtier: tiered KV-cache offload for LLM engines that serve agents.

One import root.  The rooms (source folders at the repository's top level,
mapped under this package by ``pyproject.toml``):

=========================  ==================================================
``kvtier.tiering``         policy, no tensors: cost model, predictor, decisions,
                           the HTTP service
``kvtier.store``           bytes on host and disk: frame pool, NVMe slabs, index
``kvtier.dma``             device <-> host block movement and engine layouts
``kvtier.engine_adapter``  glue into engines (transformers, SGLang, vLLM)
``kvtier.bench``           offload benchmarks and the trace simulator
``kvtier.cli``             the ``kvtier`` command line
=========================  ==================================================
"""
from kvtier.extras import MissingExtra, require

__version__ = "0.2.0"
__all__ = ["MissingExtra", "require", "__version__"]
