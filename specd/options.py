"""What every ``specd`` subcommand shares: exit codes, the model and decoding options, and
the one engine builder.

Every command's module imports this one (the ``specd.commands`` entry points, the core's
and any package's); it imports nothing that loads a model until a command runs.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import TYPE_CHECKING, Any

from .errors import BadInputError
from .forward.weights import CHOICES as WEIGHTS  # imports no model library
from .forward.weights import KV_DTYPES

if TYPE_CHECKING:
    from .engine import Engine
    from .sampling import SamplingParams

#: Exit codes: success, a check failed (``specd verify``), bad usage or bad input.
EXIT_OK, EXIT_CHECK_FAILED, EXIT_BAD_INPUT = 0, 1, 2


def add_model_args(p: argparse.ArgumentParser) -> None:
    """Options every command that loads a model takes."""
    g = p.add_argument_group("model")
    g.add_argument(
        "--model",
        default=None,
        help="alias (default: smollm2-135m), a .gguf file, local HF directory, cached hub id, "
        "or tiny[:SEED] (a tiny random model that writes random characters, for tests)",
    )
    g.add_argument(
        "--dtype",
        default=None,
        help="float32 | bfloat16 | float16 (default: float32 on CPU, bfloat16 on CUDA)",
    )
    g.add_argument(
        "--device", default=None, help="cpu | cuda[:N] | mps (default: the best available)"
    )
    g.add_argument(
        "--prefill-dtype",
        default=None,
        help="run the prompt's prefill in this dtype and decode in --dtype, e.g. bfloat16 "
        "on CPUs with bfloat16 instructions: a faster first token, not token-identical "
        "(default: --dtype)",
    )
    g.add_argument(
        "--compile",
        choices=("auto", "off", "on", "background"),
        default="auto",
        help="the compiled decode step (CUDA graphs on CUDA; specd's step kernel on x86 "
        "CPUs with AVX-512; torch.compile elsewhere): on (ready before the first request), "
        "background (requests run eager until it is ready), off, or auto (default: on for "
        "CUDA and for the step kernel, ready in seconds; off where compiling takes minutes)",
    )
    g.add_argument(
        "--packed-weights",
        choices=("auto", "on", "off"),
        default=None,
        help="a second, prepacked copy of the weights for verify passes of 3-16 tokens, "
        "one-token steps and prefills: faster on CPUs where oneDNN's product beats MKL's, "
        "for the weights' size in memory again; auto: for each kind of pass where it "
        "measures faster (default: auto for specd serve, off elsewhere)",
    )
    g.add_argument(
        "--weights",
        choices=WEIGHTS,
        default="auto",
        help="how the model's matrices are stored and read: native (a GGUF model's own "
        "blocks, e.g. the default model's Q4_1), f32 (float weights: a GGUF model's "
        "de-quantized copy), bf16 | q8 | q4 (quantized on load, weight-only, groups of 32), "
        "or auto (default: native for a GGUF model on specd's CPU forward, else f32); "
        "blocks need specd's CPU forward and compute in float32",
    )
    g.add_argument(
        "--kv-dtype",
        choices=KV_DTYPES,
        default="auto",
        help="what the KV cache stores keys and values as: float16 (half the memory, and "
        "half the bytes a step reads of it; each rounded once, when the cache takes it), "
        "float32, or auto (default: float16 where specd's step kernel serves a float32 model "
        "on the CPU, else the model's dtype)",
    )
    g.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="allow model code from the model directory (off by default)",
    )


def add_decoding_args(p: argparse.ArgumentParser) -> None:
    """Options that choose drafter, verifier, policy and sampling."""
    g = p.add_argument_group("decoding")
    g.add_argument(
        "--drafter",
        default="hybrid",
        help="drafter name, or 'none' for plain decoding (default: hybrid)",
    )
    g.add_argument(
        "--drafter-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="drafter constructor option (repeatable)",
    )
    g.add_argument(
        "--verifier",
        default=None,
        help="verifier name (default: greedy at temperature 0, else rejection)",
    )
    g.add_argument("--exit-policy", default="adaptive", help="exit policy name (default: adaptive)")
    g.add_argument(
        "--max-draft", type=int, default=8, help="most draft tokens per step, 0-256 (default: 8)"
    )
    g.add_argument("--max-tokens", type=int, default=64)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")


def thread_count(n: int, flag: str = "--threads") -> int:
    """``n`` torch threads, or :class:`BadInputError`: from 1 to twice the CPUs this process
    may run on (each thread is a stack and a spinning worker; more than the CPUs only slows
    the kernels, and a mistyped count would start thousands)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    most = 2 * max(1, cpus or 1)
    if not 1 <= n <= most:
        raise BadInputError(
            f"{flag} must be from 1 to {most} (twice the {cpus} CPUs this process may use), got {n:,}"
        )
    return n


def parse_options(items: list[str]) -> dict[str, Any]:
    """``["k=v", ...]`` -> dict, values parsed as JSON where they parse."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise BadInputError(f"option {item!r} is not KEY=VALUE")
        try:
            out[key.replace("-", "_")] = json.loads(value)
        except json.JSONDecodeError:
            out[key.replace("-", "_")] = value
    return out


def sampling_params(args: argparse.Namespace) -> SamplingParams:
    """The sampling parameters of :func:`add_decoding_args`' options."""
    from .sampling import SamplingParams

    return SamplingParams(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        max_tokens=args.max_tokens,
        stop=tuple(args.stop),
    )


def build_engine(args: argparse.Namespace, **engine_options: Any) -> Engine:
    """The engine a command's model and decoding options describe.

    :param args: parsed :func:`add_model_args` and :func:`add_decoding_args` options.
    :param engine_options: further keyword arguments of :class:`specd.Engine` that the
        command has options for (``prefix_cache_entries``, ``prefix_cache_bytes``, ...).
    """
    from .engine import Engine
    from .speculation import check_names

    opts = parse_options(args.drafter_option)
    check_names(args.drafter, args.verifier, args.exit_policy)  # a typo costs no model load
    return Engine.load(
        args.model,
        dtype=args.dtype,
        device=args.device,
        trust_remote_code=args.trust_remote_code,
        compile=getattr(args, "compile", "auto"),
        prefill_dtype=getattr(args, "prefill_dtype", None),
        packed_weights=getattr(args, "packed_weights", None) or "off",
        weights=getattr(args, "weights", "auto"),
        kv_dtype=getattr(args, "kv_dtype", "auto"),
        drafter=args.drafter,
        verifier=args.verifier,
        exit_policy=args.exit_policy,
        max_draft=args.max_draft,
        drafter_options={args.drafter: opts} if opts else None,
        **engine_options,
    )
