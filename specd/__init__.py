"""specd: exact speculative decoding for fast local code completion."""

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
from .forward.target import Target
from .generation import Completion, Delta, Generation
from .healing import Constraint
from .hookspecs import hookimpl
from .limits import ContextLengthExceeded, ContextLimits, RequestMemory, request_memory
from .ngram_index import CorpusIndex, NgramIndex
from .registry import make_drafter
from .sampling import SamplingParams, sample, warp
from .stats import Stats, percentile
from .textstream import find_stop, held_back

__version__ = "0.1.0"

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
    "find_stop",
    "held_back",
    "hookimpl",
    "make_drafter",
    "percentile",
    "request_memory",
    "sample",
    "warp",
]
