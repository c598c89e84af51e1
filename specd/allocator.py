"""The C allocator's thresholds, set for a process that computes on large CPU tensors.

glibc serves allocations above a dynamic threshold with fresh ``mmap`` pages and hands
freed memory at the top of its heap back to the system, so each of a prefill's large
activations (a ``[1024, 1536]`` float32 tensor is 6 MB) faults its pages in again, every
layer. Keeping up to :data:`MMAP_THRESHOLD` on the heap, and up to :data:`TRIM_THRESHOLD`
of freed memory in the process, lets the next layer reuse those pages: on a 2-vCPU AMD
EPYC a prefill of 1,024 tokens took 0.89-0.96 s instead of 1.03-1.14 s (docs/benchmarks.md).
The price is resident memory that stays after a peak, at most :data:`TRIM_THRESHOLD`.

``SPECD_MALLOC=system`` leaves the allocator as it is; elsewhere than glibc it is left as
it is too.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys

log = logging.getLogger(__name__)

#: Allocations up to this size come from the heap (glibc's own upper limit on 64-bit).
MMAP_THRESHOLD = 32 << 20
#: Freed memory kept by the process before the heap's top is returned to the system.
TRIM_THRESHOLD = 128 << 20
_M_TRIM_THRESHOLD = -1  # mallopt parameters, from glibc's malloc.h
_M_MMAP_THRESHOLD = -3


def keep_freed_memory() -> bool:
    """Set the thresholds above (once per process is enough; again is harmless).

    :returns: whether the allocator took them.
    """
    if os.environ.get("SPECD_MALLOC", "") == "system" or not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    took = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    took = mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 and took
    log.debug("allocator thresholds %s", "set" if took else "refused")
    return took
