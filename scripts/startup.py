"""The wall time of a one-off ``specd generate`` from the command to its exit (or, with
``--serve``, of ``specd serve --stdio`` from its start to its answer to ``initialize``), for
this checkout and, with ``--against REV``, the same command from a git revision's sources,
alternating run by run (a host's speed moves from minute to minute: only ratios measured
side by side hold). Each run is a fresh interpreter that imports specd from the checkout it
times (specd, its plugins and its language server, whatever the installed copy points at)
and runs the command as the ``specd`` script does. With ``--first-run`` each run gets an
empty cache directory (``SPECD_CACHE_DIR``), as a new user's first command does: the model's
configuration and tokenizer are written and the CPU kernels built within the run.

    python scripts/startup.py --runs 10
    python scripts/startup.py --first-run --against HEAD~1 --runs 3
    python scripts/startup.py --against HEAD~3 --runs 10 -- --max-tokens 64
    python scripts/startup.py --serve --against HEAD~3 --runs 7
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: Run in each fresh interpreter: import specd from the checkout named first, then run the
#: command line with the rest of the arguments as the ``specd`` script does.
RUNNER = """
import importlib.util, sys
from pathlib import Path

root = Path(sys.argv[1])
where = {"specd": root / "specd", "specd.plugins": root / "plugins", "specd.lsp": root / "lsp"}


class Checkout:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name in where:
            return importlib.util.spec_from_file_location(
                name, where[name] / "__init__.py", submodule_search_locations=[str(where[name])]
            )
        return None


sys.meta_path.insert(0, Checkout)
sys.argv = ["specd", *sys.argv[2:]]
import specd.cli

assert Path(specd.cli.__file__).is_relative_to(root), specd.cli.__file__
specd.cli.main()
"""


def checkout(rev: str) -> Path:
    """A worktree of ``rev`` in a temporary folder, removed at exit."""
    where = Path(tempfile.mkdtemp(prefix="specd-startup-")) / "tree"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(where), rev], check=True,
                   capture_output=True)  # fmt: skip

    def remove() -> None:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(where)],
                       capture_output=True)  # fmt: skip
        shutil.rmtree(where.parent, ignore_errors=True)

    atexit.register(remove)
    return where


def serve(root: Path) -> float:
    """Seconds from starting ``specd serve --stdio`` from ``root``'s sources to its answer to
    ``initialize`` (the model loads behind it)."""
    from specd.jsonrpc import ServerProcess

    server = ServerProcess([sys.executable, "-c", RUNNER, str(root), "serve", "--stdio"])
    try:
        server.request("initialize", {"processId": None, "rootUri": None, "capabilities": {}})
        return time.perf_counter() - server.started
    finally:
        server.close()


def run(root: Path, command: list[str], first: bool = False) -> float:
    """Seconds of one run of ``specd COMMAND`` from ``root``'s sources (from a neutral
    folder, so that no checkout on the path is imported instead); with ``first``, on an
    empty cache directory."""
    if command[0] == "serve":
        return serve(root)
    env = dict(os.environ)
    cache = Path(tempfile.mkdtemp(prefix="specd-first-run-")) if first else None
    if cache is not None:
        env["SPECD_CACHE_DIR"] = str(cache)
    t = time.perf_counter()
    try:
        r = subprocess.run([sys.executable, "-c", RUNNER, str(root), *command], cwd=tempfile.gettempdir(),
                           capture_output=True, text=True, timeout=600, env=env)  # fmt: skip
    finally:
        took = time.perf_counter() - t
        if cache is not None:
            shutil.rmtree(cache, ignore_errors=True)
    if r.returncode != 0:
        raise SystemExit(f"specd {' '.join(command)} from {root} failed:\n{r.stderr[-2000:]}")
    return took


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=8)
    p.add_argument("--against", metavar="REV", help="also time this git revision's sources")
    p.add_argument("--prompt", default="def fibonacci(n):")
    p.add_argument("--serve", action="store_true", help="time the daemon's answer to initialize")
    p.add_argument("--first-run", action="store_true", help="each run on an empty cache directory")
    p.add_argument("extra", nargs="*", help="after --: more options of specd generate")
    args = p.parse_args()
    if args.serve and args.first_run:
        p.error("--first-run times specd generate (serve answers initialize before it loads)")
    command = (
        ["serve"] if args.serve else ["generate", args.prompt, "--max-tokens", "1", *args.extra]
    )
    roots = {"this checkout": ROOT}
    if args.against:
        roots[args.against] = checkout(args.against)
    for root in roots.values():  # warm: the kernels built, the weights in the page cache
        run(root, command)
    times: dict[str, list[float]] = {name: [] for name in roots}
    for _ in range(args.runs):
        for name, root in roots.items():
            times[name].append(run(root, command, args.first_run))
    first = ", each a first run (an empty cache directory)" if args.first_run else ""
    print(f"specd {' '.join(command)}: {args.runs} runs each, alternating{first}")
    for name, ts in times.items():
        print(f"  {name:>14}: median {statistics.median(ts):.2f} s, "
              f"{min(ts):.2f}-{max(ts):.2f} s")  # fmt: skip
    if args.against:
        ratio = statistics.median(times[args.against]) / statistics.median(times["this checkout"])
        print(f"  this checkout is {ratio:.2f}x as fast as {args.against}")


if __name__ == "__main__":
    main()
