"""specd: exact speculative decoding for fast local code completion.

The public names load on first use (PEP 562): ``import specd`` and the command line's
``--help`` import no model library, and ``from specd import Engine`` costs what the engine
costs only then.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .api import DraftContext, Drafter, ExitPolicy, Verifier
    from .draft import Draft, Verdict
    from .engine import Engine
    from .errors import (
        BadInputError,
        DrafterUnavailable,
        ModelNotFoundError,
        PluginError,
        SpecdError,
        UnknownPluginError,
    )
    from .forward.models import load_target
    from .forward.target import Target
    from .forward.tiny import tiny_model
    from .generation import Completion, Delta, Generation
    from .healing import Constraint
    from .hookspecs import hookimpl
    from .kvcache import KVCache
    from .limits import (
        MAX_DRAFT,
        ContextLengthExceeded,
        ContextLimits,
        RequestMemory,
        request_memory,
    )
    from .ngram_index import CorpusIndex, NgramIndex
    from .registry import make_drafter
    from .sampling import SamplingParams, argmax, sample, warp
    from .stats import Stats, percentile
    from .textstream import find_stop, held_back

__version__ = "0.1.0"

#: Each public name and the module (relative to this package) that defines it.
_SOURCES = {
    "BadInputError": "errors",
    "Completion": "generation",
    "Constraint": "healing",
    "ContextLengthExceeded": "limits",
    "ContextLimits": "limits",
    "CorpusIndex": "ngram_index",
    "Delta": "generation",
    "Draft": "draft",
    "DraftContext": "api",
    "Drafter": "api",
    "DrafterUnavailable": "errors",
    "Engine": "engine",
    "ExitPolicy": "api",
    "Generation": "generation",
    "KVCache": "kvcache",
    "MAX_DRAFT": "limits",
    "ModelNotFoundError": "errors",
    "NgramIndex": "ngram_index",
    "PluginError": "errors",
    "RequestMemory": "limits",
    "SamplingParams": "sampling",
    "SpecdError": "errors",
    "Stats": "stats",
    "Target": "forward.target",
    "UnknownPluginError": "errors",
    "Verdict": "draft",
    "Verifier": "api",
    "argmax": "sampling",
    "find_stop": "textstream",
    "held_back": "textstream",
    "hookimpl": "hookspecs",
    "load_target": "forward.models",
    "make_drafter": "registry",
    "percentile": "stats",
    "request_memory": "limits",
    "sample": "sampling",
    "tiny_model": "forward.tiny",
    "warp": "sampling",
}

__all__ = [
    "BadInputError",
    "Completion",
    "Constraint",
    "ContextLengthExceeded",
    "ContextLimits",
    "CorpusIndex",
    "Delta",
    "Draft",
    "DraftContext",
    "Drafter",
    "DrafterUnavailable",
    "Engine",
    "ExitPolicy",
    "Generation",
    "KVCache",
    "MAX_DRAFT",
    "ModelNotFoundError",
    "NgramIndex",
    "PluginError",
    "RequestMemory",
    "SamplingParams",
    "SpecdError",
    "Stats",
    "Target",
    "UnknownPluginError",
    "Verdict",
    "Verifier",
    "argmax",
    "find_stop",
    "held_back",
    "hookimpl",
    "load_target",
    "make_drafter",
    "percentile",
    "request_memory",
    "sample",
    "tiny_model",
    "warp",
]


def __getattr__(name: str) -> Any:
    """Import a public name's module the first time the name is asked for."""
    source = _SOURCES.get(name)
    if source is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{source}", __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
