"""Which checks ``specd verify`` runs, in which order.

First every verifier involved is checked on its own (:mod:`.verifier_checks`): the named one
for the modes its ``exact_for`` lists, or the engine's defaults (``greedy`` at temperature 0,
``rejection`` when sampling). Then a named drafter is checked through the engine
(:mod:`.engine_checks`) with those verifiers. Without a drafter only the verifier is checked.
The drafter's checks all run on one conformance target, its matrices stored as ``weights``
says; the verifier's own checks run on synthetic targets whatever it says.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from contextlib import closing
from typing import Any

from .. import registry
from ..errors import BadInputError, PluginError, SpecdError
from .drafter_checks import drafter_checks
from .engine_checks import engine_checks
from .engine_scenarios import WEIGHTS, check_weights
from .results import Report, Result
from .verifier_checks import verifier_checks

#: The verifier the engine picks for each decoding mode when none is named.
DEFAULT_VERIFIERS = {"greedy": "greedy", "sampled": "rejection"}
MODES = ("greedy", "sampled")
#: The largest base seed either way: the checks derive their generators' seeds from it times
#: up to about 8e9 (``drafter_checks``: 7,919 x 1,000,003), which must stay within the 64
#: bits a generator takes.
MAX_SEED = 2**30


def plan(
    drafter: str | None, verifier: str | None, options: dict[str, Any] | None
) -> tuple[dict[str, str], dict[str, Any]]:
    """Resolve names and options.

    :returns: (decoding mode -> verifier name, the drafter's constructor options).
    :raises UnknownPluginError: when a name is not installed.
    :raises BadInputError: when neither is named, the verifier claims exactness for no
        mode, or the drafter rejects its options.
    :raises PluginError: when the drafter's constructor fails otherwise.
    """
    if drafter is None and verifier is None:
        raise BadInputError("name a --drafter, a --verifier, or both")
    if verifier is None:
        verifiers = dict(DEFAULT_VERIFIERS)
    else:
        exact_for = registry.verifier_class(verifier).exact_for
        verifiers = {mode: verifier for mode in MODES if mode in exact_for}
        if not verifiers:
            raise BadInputError(
                f"verifier {verifier!r} declares exact_for = {sorted(exact_for)}; it must list "
                "'greedy' and/or 'sampled' to be checked"
            )
    if drafter is None:
        if options:
            raise BadInputError("--drafter-option needs a --drafter")
        return verifiers, {}
    drafter_cls = registry.drafter_class(drafter)
    for name in set(verifiers.values()):
        registry.verifier_class(name)
    merged = {**dict(getattr(drafter_cls, "conformance_options", {}) or {}), **(options or {})}
    try:  # bad options are bad input: say so before any check runs
        registry.make("drafters", drafter, merged)
    except SpecdError:
        raise
    except Exception as exc:  # noqa: BLE001 - a plugin that cannot be built fails the check
        raise PluginError(
            f"drafter {drafter!r} could not be constructed with {merged}: {exc}"
        ) from exc
    return verifiers, merged


def checks(
    drafter: str | None,
    verifiers: dict[str, str],
    options: dict[str, Any],
    seed: int = 0,
    thorough: bool = False,
    weights: str = "f32",
) -> Generator[Result, None, None]:
    """Each verifier alone, cheapest first, then the drafter's reported q against its own
    draws, then the drafter through the engine, both on the target ``weights`` names."""
    by_name: dict[str, set[str]] = {}
    for mode, name in verifiers.items():
        by_name.setdefault(name, set()).add(mode)
    for name, modes in by_name.items():
        yield from verifier_checks(registry.make("verifiers", name), modes, seed=seed)
    if drafter is not None:
        yield from drafter_checks(
            drafter, options, set(verifiers), seed=seed, thorough=thorough, weights=weights
        )
        yield from engine_checks(
            drafter, options, verifiers, seed=seed, thorough=thorough, weights=weights
        )


def run(
    drafter: str | None = None,
    verifier: str | None = None,
    options: dict[str, Any] | None = None,
    *,
    seed: int = 0,
    thorough: bool = False,
    keep_going: bool = False,
    weights: str = "f32",
    on_result: Callable[[Result], None] | None = None,
) -> Report:
    """Run the conformance suite.

    :param drafter: drafter name (any installed plugin), or None to check a verifier alone.
    :param verifier: verifier name, checked alone for the modes its ``exact_for`` lists and
        then used with the drafter; None checks and uses the engine's defaults.
    :param options: drafter constructor options, over the drafter's ``conformance_options``.
    :param seed: base seed; every check is reproducible for a given seed.
    :param thorough: sample more sequences through the engine (finer sensitivity, longer).
    :param keep_going: run every check even after one failed.
    :param weights: how the conformance target's matrices are stored: ``f32`` (its float64
        weights) or ``bf16``, ``q8``, ``q4`` (blocks, :data:`.engine_scenarios.WEIGHTS`).
    :param on_result: called with each result as it arrives.
    :returns: the report; ``report.passed`` is True when every property held.
    :raises BadInputError: for a ``weights`` value not in :data:`.engine_scenarios.WEIGHTS`,
        or a ``seed`` beyond :data:`MAX_SEED` either way.
    """
    check_weights(weights)
    if isinstance(seed, bool) or not isinstance(seed, int) or abs(seed) > MAX_SEED:
        raise BadInputError(
            f"--seed must be an integer from {-MAX_SEED} to {MAX_SEED}, got {seed!r}"
        )
    verifiers, merged = plan(drafter, verifier, options)
    report = Report(drafter=drafter, verifiers=verifiers, options=merged, weights=WEIGHTS[weights])
    run_checks = checks(drafter, verifiers, merged, seed=seed, thorough=thorough, weights=weights)
    with closing(run_checks) as results:
        for result in results:
            report.results.append(result)
            if on_result is not None:
                on_result(result)
            if not result.passed and not keep_going:
                break
    return report
