"""What a verify pass costs on this host, relative to a one-token step.

Verifying a draft of ``k`` tokens is one pass over ``k + 1`` tokens. Where that pass costs
little more than a step (a memory-bound step on a CPU that streams every weight once), a
long draft is nearly free; where it costs several steps (a wide pass on a few cores, a CUDA
graph padded to the next bucket), a draft pays only if most of it is accepted. The exit
policy weighs both (``ExitPolicy.pass_cost``), so the prices are measured once per load,
with the backend that serves the passes, on a scratch cache (:func:`measure`), and kept in
the cache directory for the next start on this machine (:func:`saved`, :func:`save`): a
table is a second or two of timing that a one-token command should not pay each time.
``SPECD_REPRICE=1`` measures again (and keeps the new table); ``SPECD_PRICE_CACHE=off`` neither
reads nor keeps one; a table older than :data:`KEEP_S` is measured again. A table measured while
other work shared the cores (:data:`QUIET_SHARE`) is not kept, and serves the process that
measured it until a request's passes find the host quiet (``Engine``): each pass then waits
for its threads to be scheduled, which moves the prices of narrow and wide passes by more
than they differ (on a 2-core host beside one or two busy processes, a pass of 2 tokens
priced at 1.00, 1.09, 1.13, 1.54 and 1.63 steps; 1.13-1.33 quiet).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..errors import BadInputError
from ..kvcache import KVCache
from ..paths import cache_dir

log = logging.getLogger(__name__)

#: Pass widths priced: the pending token and drafts of 1, 3, 7 and 15 tokens.
PRICE_TOKENS = (1, 2, 4, 8, 16)
#: Cached tokens the priced passes attend over: an editor's prompt (on weights read as
#: blocks the cached keys and values are a third of what a step reads at 1k tokens, and each
#: token of a pass attends over all of them, so a pass priced over a short cache is priced low).
PRICE_CONTEXT = 1024
#: Tokens actually computed into the scratch cache; the rest of :data:`PRICE_CONTEXT` repeats
#: their keys and values (a pass's time does not depend on what it attends over).
PRICE_SEED = 64
#: Timed rounds over every width, after one warm-up round.
ROUNDS = 7
#: How long a saved table is used before it is measured again (a week).
KEEP_S = 7 * 24 * 3600
#: The least share of its threads' time the process had while its passes were priced
#: (CPU time over wall time times threads) for the table to be kept: 0.99-1.00 on a quiet
#: host, 0.49-0.69 with one or two other busy processes on two cores.
QUIET_SHARE = 0.85
#: The least wall seconds of a request's passes that tell whether the host is quiet now.
QUIET_CHECK_S = 0.1


class PassCosts:
    """The time of a pass of ``n`` tokens relative to a one-token step: ``costs(n)``;
    between priced widths the price is interpolated, past the widest extrapolated along the
    last two.

    :param prices: pass tokens -> relative time; must price the one-token step (``1``).
    :param backend: the step backend that ran the priced passes ("" where none did).
    :param cpu_share: the share of its threads' time the process had while measuring
        (:func:`measure`; None: not measured on the CPU, or read back).
    :raises BadInputError: a table without ``1``, a width below 1, a price not positive.
    """

    def __init__(
        self, prices: Mapping[int, float], backend: str = "", cpu_share: float | None = None
    ) -> None:
        if 1 not in prices:
            raise BadInputError(f"pass costs must price the one-token pass (1), got {prices}")
        for n, cost in prices.items():
            if int(n) != n or n < 1 or not (math.isfinite(cost) and cost > 0):
                raise BadInputError(
                    f"pass costs: {n} tokens priced {cost}; widths are whole numbers >= 1 and "
                    "prices positive"
                )
        self.prices = {int(n): float(prices[n]) for n in sorted(prices)}
        self.backend = backend
        self.cpu_share = cpu_share
        #: price the passes again at the next request (a table measured on a busy host, once
        #: the host is quiet: ``Engine``)
        self.reprice = False

    def __call__(self, n: int) -> float:
        if n < 1:
            raise BadInputError(f"a pass holds at least one token, got {n}")
        widths = list(self.prices)
        if n in self.prices:
            return self.prices[n]
        lo = max((w for w in widths if w < n), default=widths[0])
        hi = min((w for w in widths if w > n), default=None)
        if hi is None:  # past the widest: along the last two, or flat with one width
            if len(widths) == 1:
                return self.prices[lo]
            lo, hi = widths[-2], widths[-1]
        slope = (self.prices[hi] - self.prices[lo]) / (hi - lo)
        return self.prices[lo] + slope * (n - lo)

    def __repr__(self) -> str:
        table = ", ".join(f"{n}: {c:.2f}" for n, c in self.prices.items())
        return f"PassCosts({{{table}}}, backend={self.backend!r})"


#: Every pass priced like a step: what a target that was never priced implies.
FLAT = PassCosts({1: 1.0})


@torch.inference_mode()
def measure(
    forward: Callable[[KVCache, list[int]], object],
    cache: KVCache,
    vocab: int,
    *,
    widths: tuple[int, ...] = PRICE_TOKENS,
    rounds: int = ROUNDS,
    backend: str = "",
) -> PassCosts:
    """Time ``forward`` over chains of each of ``widths`` tokens on top of ``cache`` (rolled
    back after each), in ``rounds`` rounds after a warm-up round. A width's price is the
    median over rounds of its pass over the same round's one-token pass: passes timed
    moments apart share the machine's load (on a shared host the load moves more than a
    pass's cost between rounds), and a pass disturbed in one round moves one ratio, not
    the median. A wider pass priced below a narrower one is noise and gets its price. The
    table carries the share of its threads' time the process had meanwhile (``cpu_share``,
    on the CPU).

    :param widths: must hold 1.
    """
    if 1 not in widths or rounds < 1:
        raise BadInputError(f"pricing needs the one-token pass and a round, got {widths}, {rounds}")
    past = cache.length
    wall0, cpu0 = time.perf_counter(), time.process_time()
    gen = torch.Generator().manual_seed(0)
    ratios: dict[int, list[float]] = {n: [] for n in widths}
    sync = torch.cuda.synchronize if torch.device(cache.device).type == "cuda" else _no_sync
    for r in range(rounds + 1):
        took = {}
        for n in widths:
            tokens = torch.randint(0, vocab, (n,), generator=gen).tolist()
            sync()
            t0 = time.perf_counter()
            forward(cache, tokens)
            sync()
            took[n] = time.perf_counter() - t0
            cache.crop(past)
        if r:  # the first round warms up
            for n in widths:
                ratios[n].append(took[n] / took[1])
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    cpu_share = share(cpu, wall) if torch.device(cache.device).type == "cpu" else None
    prices, floor = {}, 0.0
    for n in sorted(widths):
        floor = max(floor, statistics.median(ratios[n]))
        prices[n] = floor
    return PassCosts(prices, backend, cpu_share)


def share(cpu_s: float, wall_s: float) -> float:
    """The share of its threads' time the process had over ``wall_s`` seconds in which it
    spent ``cpu_s`` seconds of CPU time (0 over no time)."""
    return cpu_s / (wall_s * torch.get_num_threads()) if wall_s > 0 else 0.0


def busy(costs: PassCosts) -> bool:
    """Whether ``costs`` were measured while other work shared the cores."""
    return costs.cpu_share is not None and costs.cpu_share < QUIET_SHARE


def keep_measured(key: dict, costs: PassCosts) -> bool:
    """Keep ``costs``, just measured, under ``key`` for the next start (:func:`save`) unless
    other work shared the cores meanwhile (:func:`busy`); log which. :returns: whether it
    was kept."""
    if busy(costs):
        log.info(
            "verify passes priced while other work shared the CPU (%.0f%% of %d threads' "
            "time): %s, used until the host is quiet and not kept",
            100 * (costs.cpu_share or 0.0), torch.get_num_threads(), costs,
        )  # fmt: skip
        return False
    save(key, costs)
    log.info("verify passes priced: %s", costs)
    return True


def _no_sync() -> None:
    pass


@torch.inference_mode()
def fill(cache: KVCache, length: int) -> None:
    """Extend ``cache`` (holding at least one position) to ``length`` positions by repeating
    its keys and values: a scratch cache as long as a real prompt's, for the price of
    computing a few of them."""
    have = cache.length
    if have < 1:
        raise BadInputError("a cache to fill must hold a position")
    buffers = cache.buffers(length)
    if buffers is None or length <= have:
        return
    for k, v in buffers:
        for start in range(have, length, have):
            n = min(have, length - start)
            k[:, :, start : start + n] = k[:, :, :n]
            v[:, :, start : start + n] = v[:, :, :n]
    cache.advance(length - have)


def key(target: Any, serving: str) -> dict:
    """What a saved table must match: ``target``'s model and shape, the backend that serves
    its passes, the threads, the kernel's build (its instruction set, and its library, whose
    name hashes its sources: a changed kernel prices its passes anew; whether its Q4 products
    are int8's) and the CPU."""
    from . import cpu_kernels, interleave

    p = next(iter(target.model.parameters()), None)
    return {
        "model": target.name, "vocab": target.vocab_size, "weight_bytes": target.weight_bytes(),
        "dtype": str(p.dtype) if p is not None else "", "device": str(target.device),
        "kv dtype": str(getattr(target, "kv_dtype", "")),
        "backend": serving, "threads": torch.get_num_threads(),
        "isa": cpu_kernels.isa() if serving == "kernel" else "",
        "library": cpu_kernels.library_file() if serving == "kernel" else "",
        "int8 products": serving == "kernel" and interleave.enabled(),
        "context": PRICE_CONTEXT,
        "cpu": cpu_name(), "torch": torch.__version__,
    }  # fmt: skip


def fingerprint(fast: Any) -> str:
    """A short hash of a few of a lean forward's weights (the norms, the first rows of the
    first and last layers' products), for what a kept verdict must match: two models alike
    in name and size tell apart."""
    from .blocks import BlockWeight

    h = hashlib.sha256()
    first, last = fast.layers[0], fast.layers[-1]
    for w in (fast.norm, first.ln1, last.ln2, first.wq, last.wd):
        rows = w.data[:2] if isinstance(w, BlockWeight) else w.detach()[:2]
        h.update(rows.contiguous().cpu().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else the platform's word for it."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith(("model name", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return f"{platform.machine()} {platform.processor()}"


def _cache_off() -> bool:
    return os.environ.get("SPECD_PRICE_CACHE", "").strip().lower() in ("0", "off", "false", "no")


def _path(key: dict, kind: str = "prices") -> os.PathLike:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / kind / f"{digest}.json"


def saved(key: dict) -> PassCosts | None:
    """The table saved under ``key`` (the model, the backend, the machine, the threads), or
    None when there is none, it is older than :data:`KEEP_S`, it does not parse, or
    ``SPECD_REPRICE`` is set."""
    if _cache_off() or os.environ.get("SPECD_REPRICE", "").strip().lower() in (
        "1",
        "on",
        "true",
        "yes",
    ):
        return None
    try:
        with open(_path(key), encoding="utf-8") as f:
            data = json.load(f)
        if data.get("key") != key or time.time() - float(data["saved_at"]) > KEEP_S:
            return None
        return PassCosts({int(n): float(c) for n, c in data["prices"].items()}, data["backend"])
    except (OSError, ValueError, KeyError, TypeError, BadInputError):
        return None


def save(key: dict, costs: PassCosts) -> None:
    """Keep ``costs`` under ``key`` for the next start (a failure to write is logged)."""
    data = {"backend": costs.backend, "prices": {str(n): c for n, c in costs.prices.items()}}
    _keep(_path(key), key, data)


def check_passed(key: dict) -> bool:
    """Whether the step kernel's check against the eager pass (:func:`.step.check`) passed
    for ``key`` (the model, the machine and the kernel's library, :func:`key`) within
    :data:`KEEP_S`; never with ``SPECD_PRICE_CACHE=off``."""
    return kept(key, "checks") is not None


def record_check(key: dict) -> None:
    """Remember that the check passed for ``key``, so the next start skips it."""
    keep(key, "checks", {})


def kept(key: dict, kind: str) -> dict | None:
    """What :func:`keep` kept of ``kind`` under ``key`` within :data:`KEEP_S` (the values
    besides the key and the time), or None: none kept, too old, unreadable, or
    ``SPECD_PRICE_CACHE=off``."""
    if _cache_off():
        return None
    try:
        with open(_path(key, kind), encoding="utf-8") as f:
            data = json.load(f)
        if data.get("key") != key or time.time() - float(data["saved_at"]) > KEEP_S:
            return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return {k: v for k, v in data.items() if k not in ("key", "saved_at")}


def keep(key: dict, kind: str, data: dict) -> None:
    """Keep ``data`` (JSON values) of ``kind`` under ``key`` for the next start, in the
    cache directory (a failure to write is logged; nothing with ``SPECD_PRICE_CACHE=off``)."""
    _keep(_path(key, kind), key, data)


def _keep(path: os.PathLike, key: dict, data: dict) -> None:
    if _cache_off():
        return
    data = {"key": key, "saved_at": time.time(), **data}
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f)
        os.replace(tmp, path)
    except OSError as e:
        log.info("%s not kept: %s", path, e)
