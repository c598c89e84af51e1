"""specd's step kernel against the eager lean forward, pass by pass, alternating in one
process: the median seconds of a forward of T tokens (a chain, as a verify pass feeds) on
top of a cached context, for each T and each build of the kernel asked for, and each
build's passes over its one-token step.

    python scripts/step_kernel.py --threads 2 --context 1024
    python scripts/step_kernel.py --isa avx512,avx2 --widths 1,8
    python scripts/step_kernel.py --products int8,float --widths 1,2,4,8
    python scripts/step_kernel.py --against HEAD~1 --widths 1,8 --rounds 6

The eager side runs as `specd bench --packed-weights on` runs it (prepacked weights for
every pass); the kernel is the `kernel` compile backend (specd/forward/csrc/decode_step.cpp),
built for each instruction set in turn (the builds this CPU runs: cpu_kernels.runnable_isas),
and with its quantized products over woven weights with int8 activations (``int8``, the
default) or over the blocks decoded to floats (``float``: ``SPECD_INT8_PRODUCTS=off``).
``--against REV`` adds the same builds of the kernels' sources at a git revision
(``isa@REV``), so that two versions of the kernels are timed side by side in one process:
on a machine whose speed moves from minute to minute, only such ratios hold.
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path

import torch

from specd import Engine, allocator
from specd.bench import floor
from specd.forward import cpu_kernels, decode_step


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None)
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--widths", default="1,2,4,8,16")
    p.add_argument("--isa", default=None, help="builds to compare, e.g. avx512,avx2")
    p.add_argument("--products", default="int8", help="int8, float, or both: int8,float")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--repeats", type=int, default=6)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--packed-weights", choices=("auto", "on", "off"), default="on")
    p.add_argument("--against", default=None, help="a git revision's kernels, side by side")
    args = p.parse_args()
    allocator.keep_freed_memory()  # as the specd command does
    torch.set_num_threads(args.threads)
    target = Engine.load(
        args.model, drafter="none", compile="on", packed_weights=args.packed_weights
    ).target
    step = target.compiled
    if step is None or not step.ready or step.backend != "kernel":
        raise SystemExit(f"the step kernel is not in use here: {step and step.reason}")
    isas = args.isa.split(",") if args.isa else [cpu_kernels.isa()]
    csrc: dict[str, Path | None] = {name: None for name in isas}
    if args.against:
        csrc |= {f"{name}@{args.against}": _sources_at(args.against) for name in isas}
    for name, where in csrc.items():
        try:
            cpu_kernels.use(name.partition("@")[0], where)
        except (ValueError, RuntimeError) as e:
            raise SystemExit(f"--isa {name}: {e}") from None
    modes = args.products.split(",")
    if not set(modes) <= {"int8", "float"}:
        raise SystemExit(f"--products: int8, float or both, not {args.products!r}")
    kernels = {}
    for mode in modes:  # the same weights, woven or not
        os.environ["SPECD_INT8_PRODUCTS"] = "on" if mode == "int8" else "off"
        assert target.fast is not None
        kernels[mode] = decode_step.for_decoder(target.fast)
    sides = [f"{isa}/{mode}" if len(modes) > 1 else isa for isa in csrc for mode in modes]
    widths = [int(w) for w in args.widths.split(",")]
    prepared = floor.prepare(target, args.context)
    times: dict[tuple[int, str], list[float]] = {}
    for _ in range(args.rounds):
        for t in widths:
            for side in (*sides, "eager"):
                if side != "eager":
                    isa, _, mode = side.partition("/")
                    cpu_kernels.use(isa.partition("@")[0], csrc[isa])
                    step.chosen._kernel = kernels[mode or modes[0]]  # type: ignore[attr-defined]
                runs = floor.decode_step_times(
                    target, args.context, args.repeats, prepared=prepared, tokens=t,
                    eager=side == "eager",
                )  # fmt: skip
                times.setdefault((t, side), []).append(statistics.median(runs))
    ms = {key: statistics.median(v) * 1e3 for key, v in times.items()}
    print(f"{args.context} cached tokens, {args.threads} threads, medians of {args.rounds} rounds")
    print(
        "| tokens | "
        + " | ".join(f"{k} ms | eager / {k} | {k} / its 1-token step" for k in sides)
        + " | eager ms |"
    )
    print("|---:|" + "---:|---:|---:|" * len(sides) + "---:|")
    for t in widths:
        cells = [
            f"{ms[t, k]:.2f} | {ms[t, 'eager'] / ms[t, k]:.2f} | {ms[t, k] / ms[widths[0], k]:.2f}"
            for k in sides
        ]
        print(f"| {t} | " + " | ".join(cells) + f" | {ms[t, 'eager']:.2f} |")


def _sources_at(rev: str) -> Path:
    """The kernels' sources (``specd/forward/csrc``) as they are at git revision ``rev``."""
    where = Path(tempfile.mkdtemp(prefix="specd-csrc-"))
    atexit.register(shutil.rmtree, where, True)
    root = Path(__file__).resolve().parents[1]
    tar = subprocess.run(
        ["git", "-C", str(root), "archive", rev, "specd/forward/csrc"], capture_output=True
    )
    if tar.returncode != 0:
        raise SystemExit(f"--against {rev}: {tar.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(where)], input=tar.stdout, check=True)
    return where / "specd" / "forward" / "csrc"


if __name__ == "__main__":
    main()
