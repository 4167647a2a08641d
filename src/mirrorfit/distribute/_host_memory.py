"""Keep freed host memory in the process instead of giving it back to the OS after every step:
glibc malloc's mmap threshold 32 MiB, trim threshold 256 MiB (per heap), unless the user set
their own. Resident memory then stays near its peak.
(why, and the figures: docs/architecture.md#host-memory)
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
    """Set glibc malloc's mmap and trim thresholds for this process (process-wide; safe to call
    more than once). True when set; False on another C library, or when the user set malloc
    thresholds (``GLIBC_TUNABLES`` or ``MALLOC_*_``: their choice wins).
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
