"""Which of specd's CPU kernel builds this CPU runs, and building one: the kernels
(``csrc/``) are written once over ``csrc/vec.h`` and compiled per instruction set with the
machine's C++ compiler into one library per instruction set, kept in the cache directory
(:func:`specd.paths.cache_dir`) under a name keyed by the sources, the flags and the compiler.

- ``avx512``: x86-64 with AVX-512 F/BW/DQ/VL (what PyTorch reports as ``AVX512``);
- ``avx2``: x86-64 with AVX2 and FMA (PyTorch's ``AVX2``);
- ``neon``: ARM64 (``aarch64``, ``arm64``), where NEON is part of every CPU;
- ``scalar``: plain C++, any CPU; a reference, used only when asked for.

The best one this CPU runs is chosen; ``SPECD_KERNEL_ISA`` asks for one by name, and is
refused, saying why, where this CPU cannot run it.
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import os
import platform
import shutil
import signal
import subprocess
import tempfile
import threading
from functools import cache
from pathlib import Path

import torch

log = logging.getLogger("specd.forward.cpu_kernels")

CSRC = Path(__file__).with_name("csrc")
#: The kernels' sources, built into one library; the header is part of the build's key.
SOURCES = (CSRC / "attention.cpp", CSRC / "decode_step.cpp")
HEADERS = (CSRC / "vec.h", CSRC / "qdot.h")
#: The instruction sets the kernels are built for, best first.
ISAS = ("avx512", "avx2", "neon", "scalar")
#: Each instruction set's compiler flags (NEON needs none on ARM64).
ISA_FLAGS = {
    # F16C (half to float in one instruction: a quantized block's scales) is on every CPU
    # with AVX2 (Intel since 2012, AMD since 2012) and AVX-512
    "avx512": ("-mavx512f", "-mavx512bw", "-mavx512dq", "-mavx512vl", "-mfma", "-mf16c"),
    "avx2": ("-mavx2", "-mfma", "-mf16c"),
    "neon": (),
    "scalar": (),
}
#: Flags added where this CPU has an int8 dot product (``csrc/qdot.h`` uses it): the
#: feature's name in ``/proc/cpuinfo`` for each instruction set.
DOT_FLAGS = {
    "avx512": ("avx512_vnni", ("-mavx512vnni",)),
    "avx2": ("avx_vnni", ("-mavxvnni",)),
    "neon": ("asimddp", ("-march=armv8.2-a+dotprod",)),
}
# products and sums as written, never fused by the compiler (an exact decode is one rounding
# where the source says so)
FLAGS = ("-O3", "-std=c++17", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC")
#: ``SPECD_CPU_KERNELS`` values that turn the kernels off.
OFF = ("0", "off", "false", "no")
#: About how long a build takes (2 busy cores of an EPYC: 4-9 s), for the line logged before.
BUILD_SECONDS = 10


class Unavailable(Exception):
    """This machine or setting does not use the kernels (not an error)."""


def host() -> str:
    """This CPU in a few words: its architecture and, on x86-64, what PyTorch found in it."""
    machine = platform.machine()
    if machine.lower() in ("x86_64", "amd64"):
        return f"{machine} offering {torch.backends.cpu.get_cpu_capability()}"
    return machine


def runnable() -> tuple[str, ...]:
    """The instruction sets this CPU runs, best first (``scalar`` last, on any CPU)."""
    machine = platform.machine().lower()
    if machine in ("x86_64", "amd64"):
        capability = torch.backends.cpu.get_cpu_capability()
        if capability.startswith("AVX512"):
            return ("avx512", "avx2", "scalar")
        return ("avx2", "scalar") if capability.startswith("AVX2") else ("scalar",)
    if machine in ("aarch64", "arm64"):
        return ("neon", "scalar")
    return ("scalar",)


def choose() -> str:
    """The instruction set to build for: ``SPECD_KERNEL_ISA`` where set, else the best this
    CPU runs.

    :raises Unavailable: kernels turned off, an unknown or unrunnable ``SPECD_KERNEL_ISA``,
        or a CPU none of the vector builds runs on.
    """
    if os.environ.get("SPECD_CPU_KERNELS", "").strip().lower() in OFF:
        raise Unavailable("turned off by SPECD_CPU_KERNELS")
    asked = os.environ.get("SPECD_KERNEL_ISA", "").strip().lower()
    here = runnable()
    if asked:
        if asked not in ISAS:
            raise Unavailable(f"SPECD_KERNEL_ISA={asked!r} is not one of {', '.join(ISAS)}")
        if asked not in here:
            raise Unavailable(
                f"SPECD_KERNEL_ISA={asked} asks for code this CPU cannot run ({host()}; it "
                f"runs {', '.join(here)})"
            )
        return asked
    if here[0] == "scalar":
        raise Unavailable(
            f"no vector kernels for this CPU ({host()}): they need x86-64 with AVX2 and FMA "
            f"or AVX-512, or ARM64"
        )
    return here[0]


def compiler() -> str:
    """The C++ compiler: ``$CXX``, else ``c++`` or ``g++`` on the path.

    :raises Unavailable: none found.
    """
    named = os.environ.get("CXX")
    if named:
        found = shutil.which(named)
        if not found:
            raise Unavailable(f"the C++ compiler CXX={named!r} was not found")
        return found
    cxx = shutil.which("c++") or shutil.which("g++")
    if not cxx:
        raise Unavailable("no C++ compiler (install g++, or set CXX)")
    return cxx


def cpu_features() -> set[str]:
    """The feature flags Linux lists for this CPU (``/proc/cpuinfo``); empty elsewhere."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return set()
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def isa_flags(isa: str, dot: bool = True) -> tuple[str, ...]:
    """``isa``'s compiler flags on this CPU: :data:`ISA_FLAGS`, and with ``dot`` the int8 dot
    product's (:data:`DOT_FLAGS`) where this CPU has it."""
    feature, extra = DOT_FLAGS.get(isa, ("", ()))
    has = dot and feature and feature in cpu_features()
    return ISA_FLAGS[isa] + (extra if has else ())


def command(
    cxx: str, isa: str, out: str, sources: tuple[Path, ...] = SOURCES, dot: bool = True
) -> list[str]:
    """The compiler's command line that builds ``sources`` for ``isa`` into ``out``."""
    define = f"-DSPECD_ISA_{isa.upper()}"
    return [cxx, *FLAGS, *isa_flags(isa, dot), define, *map(str, sources), "-o", out]


def build(isa: str, csrc: Path | None = None) -> Path:
    """The library of the kernels built for ``isa``, built now unless already cached (a line
    is logged before a build starts). Where the build with the dot product's flags fails (a
    compiler too old for them), it is built without them. ``csrc``: another version of the
    ``csrc/`` folder to build instead (a benchmark comparing two versions in one process).

    :raises Unavailable: no compiler; RuntimeError: the build failed.
    """
    try:
        return _build(isa, dot=True, csrc=csrc)
    except RuntimeError as e:
        if isa_flags(isa, dot=True) == isa_flags(isa, dot=False):
            raise
        log.warning("building without the int8 dot product's flags: %s", str(e)[-300:])
        return _build(isa, dot=False, csrc=csrc)


def prebuild() -> threading.Thread | None:
    """Start building the kernels :func:`choose` picks, in a thread of their own, where they
    are not built yet: a first load then converts its model while the compiler runs (on two
    cores, both at once), and its own :func:`build` waits for this one instead of starting
    another. Nothing where the kernels are off here; a failure is left for :func:`build`
    to meet and report.

    :returns: the thread, or None where none was started."""
    try:
        isa = choose()
        if _library(isa, dot=True)[1].exists():
            return None
    except Unavailable:
        return None
    thread = threading.Thread(target=_build_quietly, args=(isa,), name="specd-kernels", daemon=True)
    thread.start()
    return thread


def _build_quietly(isa: str) -> None:
    try:
        build(isa)
    except Exception as e:  # build() in the load says what went wrong
        log.debug("building the %s kernels in the background: %s", isa, e)


@cache
def _version(cxx: str) -> str:
    """What ``cxx --version`` prints (part of a build's key), once per process."""
    return subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout


#: The compilers running, each with the file it writes.
_running: dict[subprocess.Popen, str] = {}
_running_lock = threading.Lock()


def _compile(cmd: list[str], out: str) -> subprocess.CompletedProcess:
    """Run the compiler's command line ``cmd``, which writes ``out``; one still running when
    this process exits (a build started ahead of a load that failed) is stopped and ``out``
    removed (:func:`_stop_compilers`), not left to finish in the background.

    :raises subprocess.TimeoutExpired: it ran for over 300 s (it is stopped)."""
    # a process group of its own, so that stopping it stops the compiler's own children
    # (cc1plus, the assembler, the linker) with it
    group = hasattr(os, "killpg")
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=group
    )
    with _running_lock:
        _running[proc] = out
    try:
        stdout, stderr = proc.communicate(timeout=300)
    except BaseException:
        _stop(proc)
        raise
    finally:
        with _running_lock:
            _running.pop(proc, None)
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def _stop(proc: subprocess.Popen) -> None:
    """Stop a compiler started by :func:`_compile`, and every process it started."""
    try:
        if hasattr(os, "killpg"):
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()
    except OSError:  # gone already
        pass
    proc.wait()


@atexit.register
def _stop_compilers() -> None:
    with _running_lock:
        running = list(_running.items())
    for proc, out in running:
        _stop(proc)
        try:
            os.unlink(out)
        except OSError:
            pass


#: One lock per library file: a second build of the same library waits for the first.
_locks: dict[Path, threading.Lock] = {}
_locks_lock = threading.Lock()


def _lock_for(lib: Path) -> threading.Lock:
    with _locks_lock:
        return _locks.setdefault(lib, threading.Lock())


def _library(isa: str, dot: bool, csrc: Path | None = None) -> tuple[str, Path, tuple[Path, ...]]:
    """The compiler, the library's file (keyed by the sources, the flags and the compiler)
    and the sources of a build.

    :raises Unavailable: no compiler."""
    cxx = compiler()
    sources = tuple(csrc / f.name for f in SOURCES) if csrc else SOURCES
    # (an older version may lack a header of today's)
    headers = tuple(h for h in (csrc / f.name for f in HEADERS) if h.exists()) if csrc else HEADERS
    key = hashlib.sha256()
    for part in (
        *(f.read_bytes() for f in (*sources, *headers)),
        " ".join(command(cxx, isa, "", dot=dot)).encode(),
        _version(cxx).encode(),
    ):
        key.update(part)
    from ..paths import cache_dir

    return cxx, cache_dir() / "kernels" / f"kernels-{isa}-{key.hexdigest()[:16]}.so", sources


def _build(isa: str, dot: bool, csrc: Path | None = None) -> Path:
    cxx, lib, sources = _library(isa, dot, csrc)
    where = lib.parent
    if lib.exists():
        return lib
    with _lock_for(lib):  # a build of it under way in this process (prebuild): wait for it
        if lib.exists():
            return lib
        log.warning(
            "building specd's CPU kernels for %s (once per machine, about %d s)", isa, BUILD_SECONDS
        )
        where.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=where)
        os.close(fd)
        try:
            done = _compile(command(cxx, isa, tmp, sources, dot=dot), tmp)
            if done.returncode != 0:
                raise RuntimeError(f"{cxx} failed: {done.stderr.strip()[-2000:]}")
            os.replace(tmp, lib)  # atomic: another process building it at once is harmless
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return lib
