"""Which build of specd's CPU kernels runs where (specd/forward/kernel_build.py), that the
kernels step aside, saying why, where none can, that each build is built once and said so
first, and the C++ self-test of every build against a double-precision reference, ARM64's
under an emulator where the host is not ARM64."""

from __future__ import annotations

import logging
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from test_cpu_kernels import _host, _lean_forward_runs, fresh_kernel, needs_kernel  # noqa: F401 (a fixture)

from specd.forward import cpu_kernels, kernel_build

SELFTEST = Path(__file__).parents[1] / "scripts" / "check_kernels.sh"


@pytest.mark.parametrize(
    "machine, capability, chosen, runs",
    [("x86_64", "AVX512", "avx512", ("avx512", "avx2", "scalar")),
     ("AMD64", "AVX512", "avx512", ("avx512", "avx2", "scalar")),
     ("x86_64", "AVX2", "avx2", ("avx2", "scalar")),
     ("aarch64", "DEFAULT", "neon", ("neon", "scalar")),
     ("arm64", "DEFAULT", "neon", ("neon", "scalar"))],
)  # fmt: skip
def test_the_best_build_this_cpu_runs_is_chosen(monkeypatch, machine, capability, chosen, runs):
    """Guards against AVX-512 code built for a CPU without it (it would die with an illegal
    instruction), and against an AVX2 laptop or an ARM64 machine left to PyTorch."""
    _host(monkeypatch, machine, capability)
    monkeypatch.delenv("SPECD_KERNEL_ISA", raising=False)
    monkeypatch.delenv("SPECD_CPU_KERNELS", raising=False)
    assert kernel_build.runnable() == runs
    assert kernel_build.choose() == chosen


@pytest.mark.parametrize(
    "machine, capability, said",
    [("x86_64", "DEFAULT", "no vector kernels for this CPU (x86_64 offering DEFAULT)"),
     ("riscv64", "DEFAULT", "no vector kernels for this CPU (riscv64)")],
)  # fmt: skip
@pytest.mark.usefixtures("fresh_kernel")
def test_a_cpu_without_a_vector_build_leaves_everything_to_pytorch(
    tmp_path, monkeypatch, caplog, machine, capability, said
):
    _host(monkeypatch, machine, capability)
    with caplog.at_level(logging.INFO, logger="specd.forward.cpu_kernels"):
        assert not cpu_kernels.available()
    assert said in cpu_kernels.reason and said in caplog.text
    assert len(caplog.records) == 1  # one line says why
    assert cpu_kernels.isa() == "none"
    assert not list(tmp_path.rglob("*.so"))
    _lean_forward_runs()


@pytest.mark.parametrize(
    "asked, said",
    [("avx512", "SPECD_KERNEL_ISA=avx512 asks for code this CPU cannot run (x86_64 offering "
                "AVX2; it runs avx2, scalar)"),
     ("neon", "SPECD_KERNEL_ISA=neon asks for code this CPU cannot run"),
     ("sse9", "SPECD_KERNEL_ISA='sse9' is not one of avx512, avx2, neon, scalar")],
)  # fmt: skip
@pytest.mark.usefixtures("fresh_kernel")
def test_a_build_this_cpu_cannot_run_is_refused_when_asked_for(
    tmp_path, monkeypatch, caplog, asked, said
):
    _host(monkeypatch, "x86_64", "AVX2")
    monkeypatch.setenv("SPECD_KERNEL_ISA", asked)
    with caplog.at_level(logging.INFO, logger="specd.forward.cpu_kernels"):
        assert not cpu_kernels.available()
    assert said in cpu_kernels.reason and said in caplog.text
    assert cpu_kernels.isa() == "none"
    assert not list(tmp_path.rglob("*.so"))
    with pytest.raises(RuntimeError, match="cannot run the avx512 kernels"):
        cpu_kernels.use("avx512")
    with pytest.raises(ValueError, match="unknown instruction set 'sse9'"):
        cpu_kernels.use("sse9")
    _lean_forward_runs()


@pytest.mark.slow
@needs_kernel
@pytest.mark.parametrize("build", cpu_kernels.ISAS)
def test_the_environment_chooses_the_build(monkeypatch, build):
    if build not in cpu_kernels.runnable_isas():
        pytest.skip(f"this CPU ({kernel_build.host()}) cannot run the {build} kernels")
    monkeypatch.setenv("SPECD_KERNEL_ISA", build.upper())
    cpu_kernels._reset()
    try:
        assert cpu_kernels.available(), cpu_kernels.reason
        assert cpu_kernels.isa() == build  # the library's own word for what it was built for
    finally:
        monkeypatch.delenv("SPECD_KERNEL_ISA")
        cpu_kernels._reset()


@pytest.mark.slow
@pytest.mark.parametrize("build", cpu_kernels.ISAS)
def test_the_self_test_of_each_build_passes(build):
    """selftest.cpp: the step and attention kernels of each build against a plain
    double-precision reference (chains and trees of 1-16 tokens, caches of several lengths),
    natively, or for neon on another host cross-built and run under qemu-aarch64."""
    if build not in cpu_kernels.runnable_isas() and build != "neon":
        pytest.skip(f"this CPU ({kernel_build.host()}) cannot run the {build} kernels")
    native = build in cpu_kernels.runnable_isas()
    needed = ["bash", "c++"] if native else ["bash", "aarch64-linux-gnu-g++", "qemu-aarch64"]
    missing = [
        tool for tool in needed if not shutil.which(tool) and not shutil.which(tool + "-static")
    ]
    if missing:
        pytest.skip(
            f"the {build} self-test on {platform.machine()} needs {', '.join(needed[1:])}; "
            f"missing: {', '.join(missing)}"
            + ("" if native else " (apt-get install g++-aarch64-linux-gnu qemu-user)")
        )
    done = subprocess.run(
        ["bash", str(SELFTEST), build],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYTHON": sys.executable},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"specd kernels, {build}: step" in done.stdout and done.stdout.rstrip().endswith("ok")


@pytest.mark.slow
def test_the_avx2_builds_avx_vnni_code_passes_its_self_test():
    """The avx2 build's AVX-VNNI dot products (Intel's CPUs since 2021, without AVX-512),
    checked where a CPU has AVX-512 VNNI: the same 256-bit instruction in that encoding."""
    if (
        "avx512_vnni" not in kernel_build.cpu_features()
        or "avx2" not in cpu_kernels.runnable_isas()
    ):
        pytest.skip(f"this CPU ({kernel_build.host()}) has no AVX-512 VNNI to run it with")
    if not shutil.which("c++"):
        pytest.skip("no C++ compiler (c++)")
    done = subprocess.run(
        ["bash", str(SELFTEST), "avx2"],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYTHON": sys.executable, "DOT": "evex"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "specd kernels, avx2: step" in done.stdout and done.stdout.rstrip().endswith("ok")


@needs_kernel
@pytest.mark.usefixtures("fresh_kernel")
def test_built_once_into_the_cache_directory_saying_so_first(tmp_path, monkeypatch, caplog):
    said_first = []
    run = kernel_build._compile

    def compile_(cmd, out):  # the compiler starts: was the user told?
        said_first.append("building specd's CPU kernels for" in caplog.text)
        return run(cmd, out)

    monkeypatch.setattr(kernel_build, "_compile", compile_)
    with caplog.at_level(logging.INFO, logger="specd.forward.cpu_kernels"):
        assert cpu_kernels.available()
    name = cpu_kernels.isa()
    assert said_first == [True]
    assert f"building specd's CPU kernels for {name} (once per machine, about" in caplog.text
    built = list((tmp_path / "kernels").glob("kernels-*.so"))
    assert [b.name.split("-")[1] for b in built] == [name]  # one library per build
    stamp = built[0].stat().st_mtime_ns
    cpu_kernels._reset()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="specd.forward.cpu_kernels"):
        assert cpu_kernels.available()
    assert built[0].stat().st_mtime_ns == stamp  # loaded, not rebuilt
    assert said_first == [True] and "building" not in caplog.text


@pytest.mark.usefixtures("fresh_kernel")
def test_the_bench_names_the_build_its_kernels_ran(monkeypatch):
    """``specd bench --json``'s ``machine.isa``: the build in use, or ``none``."""
    from specd.bench.harness import machine_info
    from specd.forward.tiny import tiny_target

    target = tiny_target(hidden_size=256, dtype=torch.float32)
    _host(monkeypatch, "x86_64", "DEFAULT")
    assert machine_info(target)["isa"] == "none"
    cpu_kernels._reset()
    monkeypatch.undo()
    if cpu_kernels.available():
        assert machine_info(target)["isa"] == cpu_kernels.isa() != "none"


def test_a_compiler_without_the_dot_product_flags_builds_without_them(
    tmp_path, monkeypatch, caplog
):
    """On a CPU with an int8 dot product, a compiler that refuses its flag (too old) still
    builds the kernels, without it, saying so."""
    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    fake = tmp_path / "old-cxx"
    fake.write_text(
        '#!/bin/sh\nfor a in "$@"; do case "$a" in -mavx512vnni|-mavxvnni|-march=armv8.2*)'
        ' echo "unrecognized command-line option $a" >&2; exit 1;; esac; done\n'
        f'exec {cxx} "$@"\n'
    )
    fake.chmod(0o755)
    monkeypatch.setenv("CXX", str(fake))
    monkeypatch.setenv("SPECD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(
        kernel_build, "cpu_features", lambda: {"avx512_vnni", "avx_vnni", "asimddp"}
    )
    isa = "scalar"  # any build: its dot flags are faked in, and the fake refuses them
    monkeypatch.setitem(kernel_build.DOT_FLAGS, isa, ("avx512_vnni", ("-mavx512vnni",)))
    with caplog.at_level(logging.WARNING, logger="specd.forward.cpu_kernels"):
        lib = kernel_build.build(isa)
    assert lib.exists()
    assert "without the int8 dot product's flags" in caplog.text
    assert "-mavx512vnni" not in " ".join(kernel_build.command(cxx, isa, "", dot=False))


def _fake_compiler(monkeypatch, tmp_path, seconds: float = 0.0) -> list[list[str]]:
    """The kernels built for ``scalar`` into ``tmp_path/cache`` by a stand-in compiler that
    takes ``seconds`` and writes an empty library; returns its command lines, as run."""
    try:
        kernel_build.compiler()
    except kernel_build.Unavailable:
        pytest.skip("no C++ compiler")
    compiled: list[list[str]] = []

    def compile_(cmd, out):
        compiled.append(cmd)
        time.sleep(seconds)
        Path(out).write_bytes(b"")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(kernel_build, "_compile", compile_)
    monkeypatch.setenv("SPECD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("SPECD_KERNEL_ISA", "scalar")  # runs anywhere
    monkeypatch.delenv("SPECD_CPU_KERNELS", raising=False)
    return compiled


def test_another_version_of_the_sources_builds_from_its_own_files(tmp_path, monkeypatch):
    """``kernel_build.build(isa, csrc)`` (``scripts/step_kernel.py --against REV``): the
    compiler is given that folder's sources, and the library is keyed by their contents, so a
    copy that differs gets a library of its own and an identical one shares the default's."""
    compiled = _fake_compiler(monkeypatch, tmp_path)
    same, edited = tmp_path / "same", tmp_path / "edited"
    shutil.copytree(kernel_build.CSRC, same)
    shutil.copytree(kernel_build.CSRC, edited)
    with open(edited / "vec.h", "a") as f:
        f.write("// another version\n")
    default = kernel_build.build("scalar")
    assert kernel_build.build("scalar", same) == default
    other = kernel_build.build("scalar", edited)
    assert other != default and other.exists()
    assert [[c for c in cmd if c.endswith(".cpp")] for cmd in compiled] == [
        [str(kernel_build.CSRC / "attention.cpp"), str(kernel_build.CSRC / "decode_step.cpp")],
        [str(edited / "attention.cpp"), str(edited / "decode_step.cpp")],
    ]


def test_a_build_started_ahead_is_waited_for_not_repeated(tmp_path, monkeypatch, caplog):
    """A first load starts the build in the background (``prebuild``); the load's own
    ``build`` then waits for that one to finish instead of running the compiler again, and
    the user is told once, before the compiler starts."""
    compiled = _fake_compiler(monkeypatch, tmp_path, seconds=0.5)
    with caplog.at_level(logging.WARNING, logger="specd.forward.cpu_kernels"):
        thread = kernel_build.prebuild()
        assert thread is not None
        for _ in range(500):  # until the background compiler has started
            if compiled:
                break
            time.sleep(0.01)
        lib = kernel_build.build("scalar")  # while it still runs
        assert lib.exists()
        thread.join(5)
    assert len(compiled) == 1
    assert caplog.text.count("building specd's CPU kernels for scalar") == 1
    assert kernel_build.prebuild() is None  # built: nothing more to start


def test_nothing_is_built_ahead_where_the_kernels_are_off(tmp_path, monkeypatch):
    compiled = _fake_compiler(monkeypatch, tmp_path)
    monkeypatch.setenv("SPECD_CPU_KERNELS", "off")
    assert kernel_build.prebuild() is None
    monkeypatch.setenv("SPECD_CPU_KERNELS", "on")
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    assert kernel_build.prebuild() is None
    assert compiled == [] and not (tmp_path / "cache").exists()


def test_a_load_starts_the_build_before_converting_its_model(monkeypatch):
    """``models.load`` asks for the kernels ahead (``cpu_kernels.build_ahead``) before it
    resolves the model, which on a first run converts it: the two overlap. A load without
    the lean forward does not ask; nor does a process that has loaded the kernels already."""
    from specd.forward import models

    order: list[str] = []
    monkeypatch.setattr(cpu_kernels, "build_ahead", lambda: order.append("kernels"))

    def resolve(model, weights=True):
        order.append("resolve")
        raise models.ModelNotFoundError("stop here")

    monkeypatch.setattr(models, "resolve", resolve)
    with pytest.raises(models.ModelNotFoundError):
        models.load(models.DEFAULT_MODEL, device="cpu")
    assert order == ["kernels", "resolve"]
    order.clear()
    with pytest.raises(models.ModelNotFoundError):
        models.load(models.DEFAULT_MODEL, device="cpu", lean=False)
    assert order == ["resolve"]
    monkeypatch.undo()
    started: list[bool] = []
    monkeypatch.setattr(kernel_build, "prebuild", lambda: started.append(True))
    monkeypatch.setattr(cpu_kernels, "_tried", True)
    cpu_kernels.build_ahead()
    monkeypatch.setattr(cpu_kernels, "_tried", False)
    cpu_kernels.build_ahead()
    assert started == [True]


def test_a_compiler_still_running_at_exit_is_stopped_and_its_output_removed(tmp_path):
    """A build started ahead of a load that then fails (a model not found) must not go on
    compiling after the process has exited, nor leave its half-written library behind."""
    out = tmp_path / "kernels-partial.so"
    script = f"echo partial > {out}; sleep 60"
    done: list[object] = []
    thread = threading.Thread(target=lambda: done.append(_run_quietly(["sh", "-c", script], out)))
    thread.start()
    for _ in range(500):  # until it has started writing
        if out.exists() and kernel_build._running:
            break
        time.sleep(0.01)
    started = time.perf_counter()
    kernel_build._stop_compilers()  # what the process runs at exit
    thread.join(10)
    assert time.perf_counter() - started < 5 and not thread.is_alive()
    assert not out.exists() and not kernel_build._running


def _run_quietly(cmd: list[str], out: Path) -> object:
    try:
        return kernel_build._compile(cmd, str(out))
    except Exception as e:
        return e
