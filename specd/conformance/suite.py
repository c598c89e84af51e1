"""Which checks ``specd verify`` runs for a drafter and a verifier, in which order."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import closing
from typing import Any

from .. import registry
from ..errors import BadInputError
from .engine_checks import engine_checks
from .results import Report, Result
from .verifier_checks import verifier_checks

#: The verifier the engine picks for each decoding mode when none is named.
DEFAULT_VERIFIERS = {"greedy": "greedy", "sampled": "rejection"}
MODES = ("greedy", "sampled")


def plan(
    drafter: str, verifier: str | None, options: dict[str, Any] | None
) -> tuple[dict[str, str], dict[str, Any]]:
    """Resolve names and options.

    :returns: (decoding mode -> verifier name, the drafter's constructor options).
    :raises UnknownPluginError: when a name is not installed.
    :raises BadInputError: when the verifier claims exactness for no mode.
    """
    drafter_cls = registry.drafter_class(drafter)
    if verifier is None:
        verifiers = dict(DEFAULT_VERIFIERS)
        for name in verifiers.values():
            registry.verifier_class(name)
    else:
        claimed = set(registry.verifier_class(verifier).exact_for) & set(MODES)
        if not claimed:
            raise BadInputError(
                f"verifier {verifier!r} declares exact_for = {sorted(registry.verifier_class(verifier).exact_for)}; "
                f"it must list 'greedy' and/or 'sampled' to be checked"
            )
        verifiers = {mode: verifier for mode in MODES if mode in claimed}
    merged = {**dict(getattr(drafter_cls, "conformance_options", {}) or {}), **(options or {})}
    return verifiers, merged


def checks(
    drafter: str, verifiers: dict[str, str], options: dict[str, Any], seed: int = 0
) -> Iterator[Result]:
    """Every check, cheapest first: each verifier alone, then the drafter through the engine."""
    by_name: dict[str, set[str]] = {}
    for mode, name in verifiers.items():
        by_name.setdefault(name, set()).add(mode)
    for name, modes in by_name.items():
        yield from verifier_checks(registry.make("verifiers", name), modes, seed=seed)
    yield from engine_checks(drafter, options, verifiers, seed=seed)


def run(
    drafter: str,
    verifier: str | None = None,
    options: dict[str, Any] | None = None,
    *,
    seed: int = 0,
    keep_going: bool = False,
    on_result: Callable[[Result], None] | None = None,
) -> Report:
    """Run the conformance suite.

    :param drafter: drafter name (any installed plugin).
    :param verifier: verifier name; None checks the engine's defaults (greedy at temperature
        0, rejection when sampling).
    :param options: drafter constructor options, over the drafter's ``conformance_options``.
    :param seed: base seed; every check is reproducible for a given seed.
    :param keep_going: run every check even after one failed.
    :param on_result: called with each result as it arrives.
    :returns: the report; ``report.passed`` is True when every property held.
    """
    verifiers, merged = plan(drafter, verifier, options)
    report = Report(drafter=drafter, verifiers=verifiers, options=merged)
    with closing(checks(drafter, verifiers, merged, seed=seed)) as results:
        for result in results:
            report.results.append(result)
            if on_result is not None:
                on_result(result)
            if not result.passed and not keep_going:
                break
    return report
