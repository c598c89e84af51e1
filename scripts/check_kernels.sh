#!/usr/bin/env bash
# Build specd's kernel self-test (specd/forward/csrc/selftest.cpp with the kernels) for one
# instruction set and run it: natively where this CPU runs that set, and for neon on an
# x86-64 host with Debian's cross compiler under qemu's user-mode emulator
# (apt-get install g++-aarch64-linux-gnu qemu-user).
#
#   scripts/check_kernels.sh avx512|avx2|neon|scalar [tolerance]
#
# DOT=on or DOT=off builds with or without the int8 dot product's flags (AVX-512 VNNI,
# AVX-VNNI, ARMv8.2's dot product) whatever this CPU has; by default, as the kernels build here.
# DOT=evex checks the avx2 build's AVX-VNNI code (Intel's CPUs since 2021 without AVX-512) on
# a CPU with AVX-512 VNNI instead: the same 256-bit dot product in its AVX-512 encoding.
#
# Exit codes: 0 within tolerance, 1 over it (or a failed build), 2 bad usage, 77 this host
# cannot run that set (the reason is printed).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
isa=${1:-}
tolerance=${2:-1e-4}
case "$isa" in
    avx512 | avx2 | neon | scalar) ;;
    *)
        echo "usage: $0 avx512|avx2|neon|scalar [tolerance]" >&2
        exit 2
        ;;
esac
case "${DOT:-}:$isa" in
    :* | on:* | off:* | evex:avx2) ;;
    *)
        echo "DOT is on, off, or evex (with avx2 only), not '${DOT:-}' with $isa" >&2
        exit 2
        ;;
esac
python=${PYTHON:-$root/.venv/bin/python}
[ -x "$python" ] || python=python3

# The flags and the host's verdict from the code that builds the kernels, so the two agree.
read -r runs flags < <(cd "$root" && "$python" - "$isa" <<'PY'
import sys
import os
from specd.forward.kernel_build import DOT_FLAGS, ISA_FLAGS, cpu_features, isa_flags, runnable
isa = sys.argv[1]
dot = os.environ.get("DOT", "")  # on/off: with or without the int8 dot product's flags
feature, extra = DOT_FLAGS.get(isa, ("", ()))
flags = {"off": ISA_FLAGS[isa], "on": ISA_FLAGS[isa] + extra}
if dot == "evex":  # avx2's AVX-VNNI branch, its dot product encoded as AVX-512 VL's
    feature = DOT_FLAGS["avx512"][0]
    flags["evex"] = ISA_FLAGS[isa] + ("-mavx512f", "-mavx512vl", "-mavx512vnni", "-D__AVXVNNI__=1")
# built with a dot product this x86-64 CPU lacks, the test would stop at its first one
lacks = dot in ("on", "evex") and isa in runnable() and feature and feature not in cpu_features()
print("no" if lacks else "yes" if isa in runnable() else "no", " ".join(flags.get(dot, isa_flags(isa))) or "-")
PY
)
[ "$flags" = "-" ] && flags=""

run=()
cxx=${CXX:-c++}
if [ "$runs" != yes ]; then
    if [ "$isa" != neon ]; then
        echo "this CPU ($(uname -m)) cannot run the $isa kernels${DOT:+ with DOT=$DOT}" >&2
        exit 77
    fi
    cxx=${CROSS_CXX:-aarch64-linux-gnu-g++}
    qemu=$(command -v qemu-aarch64 || command -v qemu-aarch64-static || true)
    missing=()
    command -v "$cxx" > /dev/null || missing+=("$cxx (apt-get install g++-aarch64-linux-gnu)")
    [ -n "$qemu" ] || missing+=("qemu-aarch64 (apt-get install qemu-user)")
    if [ ${#missing[@]} -gt 0 ]; then
        echo "neon on $(uname -m) needs a cross compiler and an emulator; missing: ${missing[*]}" >&2
        exit 77
    fi
    sysroot=${QEMU_LD_PREFIX:-/usr/aarch64-linux-gnu}
    run=(env OMP_WAIT_POLICY=passive "$qemu" -L "$sysroot")  # spinning threads crawl emulated
    echo "cross: $("$cxx" --version | head -1); emulator: $("$qemu" --version | head -1)"
fi

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
csrc=$root/specd/forward/csrc
if [ "${DOT:-}" = evex ]; then  # the AVX-VNNI intrinsic as its AVX-512 VL form
    printf '#include <immintrin.h>\n#undef _mm256_dpbusd_avx_epi32\n#define _mm256_dpbusd_avx_epi32 _mm256_dpbusd_epi32\n' > "$out/evex.h"
    flags="$flags -include $out/evex.h"
fi
# shellcheck disable=SC2086  # flags is a list of words
"$cxx" -O3 -std=c++17 -ffp-contract=off -fopenmp $flags "-DSPECD_ISA_${isa^^}" \
    "$csrc/selftest.cpp" "$csrc/attention.cpp" "$csrc/decode_step.cpp" -o "$out/selftest"
"${run[@]}" "$out/selftest" "$tolerance"
