"""What a conformance check reports."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Result:
    """One property, checked once.

    ``property`` is a stable id (``verifier/law/chain-sampled``); ``detail`` says what was
    measured; ``counterexample`` is set when the property failed and says where.
    """

    property: str
    subject: str
    passed: bool
    detail: str
    counterexample: dict[str, Any] | None = None
    seconds: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {
            "property": self.property,
            "subject": self.subject,
            "passed": self.passed,
            "detail": self.detail,
            "counterexample": self.counterexample,
            "seconds": round(self.seconds, 3),
            **({"info": self.info} if self.info else {}),
        }


@dataclass
class Report:
    drafter: str | None
    verifiers: dict[str, str]  # decoding mode -> verifier name
    options: dict[str, Any]
    #: how the conformance target's matrices are stored: ``f64``, ``bf16``, ``q8_0``, ``q4_1``
    weights: str = "f64"
    results: list[Result] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)

    def failures(self) -> list[Result]:
        return [r for r in self.results if not r.passed]

    def as_json(self) -> dict[str, Any]:
        return {
            "drafter": self.drafter,
            "verifiers": self.verifiers,
            "options": self.options,
            "weights": self.weights,
            "passed": self.passed,
            "results": [r.as_json() for r in self.results],
        }
