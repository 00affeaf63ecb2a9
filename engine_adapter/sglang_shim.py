"""Importing SGLang's storage interface on a machine where ``import sglang`` fails.

Inside an SGLang server ``sglang`` is already imported and this is a plain
import.  Elsewhere (CPU-only tests and benchmarks) ``import sglang`` runs the
package's front-end ``__init__`` (HF patches, multimodal processors,
torchvision), which a CPU-only install cannot satisfy; the storage modules
themselves do not need it.  :func:`import_sglang_storage` then registers the
``sglang`` package without running its ``__init__`` and imports the storage
modules from the installed files as they are.  ``kvtier.engine_adapter.sglang``
calls it at import, so importing that module is enough to register SGLang's
CPU-safe storage modules.
"""
from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
import types

log = logging.getLogger("kvtier.sglang")

SGLANG_VERSION = "0.5.23"   # the version the backend is written and tested against


def import_sglang_storage() -> types.ModuleType:
    """Import ``sglang.srt.mem_cache.hicache_storage``.

    Inside an SGLang server ``sglang`` is already imported and this is a plain
    import.  Elsewhere (CPU-only tests and benchmarks) ``import sglang`` runs
    the package's front-end ``__init__`` (HF patches, multimodal processors,
    torchvision), which a CPU-only install cannot satisfy; the storage modules
    themselves do not need it.  In that case the ``sglang`` package is
    registered without running its ``__init__`` and the storage modules are
    imported from the installed files as they are.  Raises ``ImportError``
    when sglang is not installed.
    """
    try:
        return importlib.import_module("sglang.srt.mem_cache.hicache_storage")
    except ImportError:
        if "sglang" in sys.modules and getattr(sys.modules["sglang"], "__kvtier_bare__", False):
            raise
    except Exception as exc:  # the front-end __init__ failed for another reason
        log.debug("import sglang failed (%s); importing its storage modules only", exc)
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("sglang is not installed (pip install --no-deps sglang==%s)" % SGLANG_VERSION)
    for name in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
        del sys.modules[name]   # drop what the failed import left half-initialised
    pkg = types.ModuleType("sglang")
    pkg.__path__ = list(spec.submodule_search_locations)
    pkg.__file__ = spec.origin
    pkg.__spec__ = spec
    pkg.__kvtier_bare__ = True
    sys.modules["sglang"] = pkg
    return importlib.import_module("sglang.srt.mem_cache.hicache_storage")
