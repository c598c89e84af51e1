"""``specd verify``: run the conformance suite against installed plugins."""

from __future__ import annotations

import argparse
import json
import sys

from ..forward.weights import QUANTIZED  # imports no model library
from ..options import EXIT_CHECK_FAILED, EXIT_OK, parse_options
from .results import Result

#: ``--weights`` values, the default first (:data:`.engine_scenarios.WEIGHTS`).
WEIGHT_CHOICES = ("f32", *QUANTIZED)


def cmd_verify(args: argparse.Namespace) -> int:
    import torch

    from .suite import run

    # The checks run tiny models one token at a time: threads only add overhead.
    torch.set_num_threads(1)
    options = parse_options(args.drafter_option)

    def show(result: Result) -> None:
        if args.json:
            return
        mark = "PASS" if result.passed else "FAIL"
        print(
            f"{mark} {result.property:<32} {result.subject}: {result.detail} [{result.seconds:.1f} s]"
        )
        if not result.passed and result.counterexample:
            print("     counterexample: " + json.dumps(result.counterexample, default=str))
        sys.stdout.flush()

    report = run(
        args.drafter,
        args.verifier,
        options,
        seed=args.seed,
        thorough=args.thorough,
        keep_going=args.keep_going,
        weights=args.weights,
        on_result=show,
    )
    # The weights matter only to the drafter's checks: the verifier's use synthetic targets.
    on = f" on {report.weights} weights" if args.drafter else ""
    if args.json:
        print(json.dumps(report.as_json(), default=str))
    elif report.passed:
        checked = f"drafter {args.drafter!r} with " if args.drafter else ""
        modes = ", ".join(f"{v} ({m})" for m, v in report.verifiers.items())
        print(f"specd verify: every property holds for {checked}{modes}{on}")
    else:
        failed = ", ".join(r.property for r in report.failures())
        print(f"specd verify: FAILED {failed}{on}", file=sys.stderr)
    return EXIT_OK if report.passed else EXIT_CHECK_FAILED


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "verify",
        help="check that a drafter and verifier keep decoding exact (tiny models, seconds)",
        description=(
            "Run the conformance suite on tiny models. The verifier (the named one, or the "
            "engine's defaults) is checked alone against synthetic targets: greedy identity, "
            "seeded reproducibility, the target's sequence law for chains and trees. A named "
            "drafter is then checked through the engine on a tiny random target: greedy "
            "identity with plain decoding, and the exactly enumerated sequence law when "
            "sampling. Exit 0 when every property holds, 1 naming the one that failed with a "
            "counterexample, 2 for bad input. See docs/verification.md."
        ),
    )
    p.add_argument(
        "--drafter",
        default=None,
        help="drafter name (any installed plugin); omit to check a verifier alone",
    )
    p.add_argument(
        "--verifier",
        default=None,
        help="verifier name, checked for the modes its exact_for lists (default: greedy at "
        "temperature 0 and rejection when sampling)",
    )
    p.add_argument(
        "--drafter-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="drafter constructor option (repeatable); overrides the drafter's conformance_options",
    )
    p.add_argument(
        "--weights",
        choices=WEIGHT_CHOICES,
        default="f32",
        help="how the drafter's tiny target stores its matrices: f32 (its float64 weights, the "
        "default) or bf16 | q8 | q4 (blocks quantized from them, computing in float32; the "
        "target's law is enumerated from the quantized model itself)",
    )
    p.add_argument("--seed", type=int, default=0, help="base seed of every check (default: 0)")
    p.add_argument(
        "--thorough",
        action="store_true",
        help="sample four times more sequences through the engine: finer sensitivity, a few "
        "times longer (docs/verification.md)",
    )
    p.add_argument("--keep-going", action="store_true", help="run every check even after a failure")
    p.add_argument("--json", action="store_true", help="print one JSON report")
    p.set_defaults(func=cmd_verify)
