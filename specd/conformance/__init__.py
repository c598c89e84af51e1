"""The conformance suite behind ``specd verify``: does a drafter or verifier keep decoding
exact? Verifiers are checked alone against synthetic targets; drafters end to end through
the engine on a tiny random target whose sequence law is enumerated exactly.
See docs/verification.md for what each check proves.
"""

from .results import Report, Result

__all__ = ["Report", "Result", "run"]


def __getattr__(name: str):
    if name == "run":  # the suite loads torch: not for ``specd verify --help``
        from .suite import run

        return run
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
