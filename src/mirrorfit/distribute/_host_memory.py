"""Keep freed host memory in the process instead of giving it back to the OS after every step.

glibc's malloc hands large freed blocks back to the kernel (``munmap``, heap trimming) and
faults them in again, zeroed page by page, on the next allocation. A training step frees and
allocates the same buffers every step, so a worker can spend its time in page faults: on the
CNN, 2 workers x 1 thread on this 2-core host, a worker took 18,000-33,000 faults/s and 7-10%
of its core in the kernel, and the other worker waited for it at every all-reduce. With the
thresholds below: 75-250 faults/s and 1%. Which worker was hit changed from run to run, which
also made throughput jump between runs.

Only the *thresholds* change: allocations up to 32 MiB come from malloc's heaps (larger ones
are still mapped and unmapped, so a freed dataset goes back to the OS), and free memory at the
top of a heap is kept up to 256 MiB. That limit is per heap, and glibc gives threads heaps of
their own: what each thread freed stays in the process for its next allocation, so resident
memory stays near the peak of every thread together (a probe with 16 threads freeing 48 MiB
each kept 793 MiB, against 25 MiB by default). For a training process, whose every step needs
that memory again, this is the point; for a notebook it may not be, so it is not done behind
a library caller's back: ``mirrorfit train`` and ``mirrorfit bench`` ask for it
(``configure_devices(keep_freed_memory=True)``). A user who sets these thresholds themselves,
in ``GLIBC_TUNABLES`` or glibc's ``MALLOC_*_`` variables, keeps them: nothing is changed then.
"""

from __future__ import annotations

import ctypes
import os

# mallopt(3) parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 << 20  # glibc's ceiling for M_MMAP_THRESHOLD on 64-bit hosts
TRIM_THRESHOLD_BYTES = 256 << 20
# A user's own settings of what this changes (other malloc tunables, like arena_max, do not
# conflict and are left as they are).
_USER_TUNABLES = ("mmap_threshold", "trim_threshold", "top_pad", "mmap_max")
_USER_VARIABLES = (
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_TOP_PAD_",
    "MALLOC_MMAP_MAX_",
)


def keep_freed_memory() -> bool:
    """Set glibc malloc's mmap and trim thresholds for this process (see the module docstring).

    Returns True when they were set; False on a C library other than glibc, or when the user
    set malloc thresholds (``GLIBC_TUNABLES`` or ``MALLOC_*_``: their choice wins).
    Process-wide, and safe to call more than once.
    """
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    if any(f"glibc.malloc.{name}" in tunables for name in _USER_TUNABLES) or any(
        name in os.environ for name in _USER_VARIABLES
    ):
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
    return (
        mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
        and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1
    )
