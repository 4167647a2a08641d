"""Keep freed host memory in the process instead of giving it back to the OS after every step.

glibc's malloc hands large freed blocks back to the kernel (``munmap``, heap trimming) and
faults them in again, zeroed page by page, on the next allocation. A training step frees and
allocates the same buffers every step, so a worker can spend its time in page faults: on the
CNN, 2 workers x 1 thread on this 2-core host, a worker took 18,000-33,000 faults/s and 7-10%
of its core in the kernel, and the other worker waited for it at every all-reduce. With the
thresholds below: 75-250 faults/s and 1%. Which worker was hit changed from run to run, which
also made throughput jump between runs.

Only the *thresholds* change: allocations up to 32 MiB come from malloc's heap (larger ones
are still mapped and unmapped, so a freed dataset goes back to the OS), and free memory at
the top of the heap is kept up to 256 MiB. A user who sets malloc tunables in
``GLIBC_TUNABLES`` keeps them: then nothing is changed here.
"""

from __future__ import annotations

import ctypes
import os

# mallopt(3) parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 << 20  # glibc's ceiling for M_MMAP_THRESHOLD on 64-bit hosts
TRIM_THRESHOLD_BYTES = 256 << 20


def keep_freed_memory() -> bool:
    """Set glibc malloc's mmap and trim thresholds for this process (see the module docstring).

    Returns True when they were set; False on a C library other than glibc, or when
    ``GLIBC_TUNABLES`` already sets malloc options (the user's choice wins). Process-wide and
    safe to call more than once.
    """
    if "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    try:
        glibc = os.confstr("CS_GNU_LIBC_VERSION")  # None, or an error, off glibc
        mallopt = ctypes.CDLL(None).mallopt  # the process's own C library
    except (ValueError, OSError, AttributeError):
        return False
    if not glibc:
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # mallopt returns 1 on success. The mmap threshold first: setting it also stops glibc's
    # dynamic adjustment of both thresholds, which would otherwise undo the trim threshold.
    return (mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
            and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1)
