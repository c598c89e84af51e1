"""The conformance suite behind ``specd verify``: does a drafter or verifier keep decoding
exact? Verifiers are checked alone against synthetic targets; drafters end to end through
the engine on a tiny random target whose sequence law is enumerated exactly.
See docs/verification.md for what each check proves.
"""

from .results import Report, Result
from .suite import run

__all__ = ["Report", "Result", "run"]
