"""Give each worker that ``mirrorfit launch`` starts on this host CPUs of its own.

Unbound, two workers on two cores share both: the scheduler moves their compute threads from
core to core and at times stacks them on one, and at every step's all-reduce the other worker
waits. Bound, each computes on its own cores, as ``mpirun --bind-to core`` does. TensorFlow sizes
its default thread pools from the CPUs a process may run on, so a bound worker started without
``--threads-per-worker`` no longer oversubscribes the host either. Linux only (``sched_*``).
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator, Sequence


def available_cpus() -> list[int] | None:
    """The CPUs this process may run on, sorted; None where the OS cannot bind (not Linux)."""
    if not (hasattr(os, "sched_getaffinity") and hasattr(os, "sched_setaffinity")):
        return None
    return sorted(os.sched_getaffinity(0))


def plan_cpus(cpus: Sequence[int], tasks: int) -> list[tuple[int, ...]] | None:
    """``tasks`` disjoint runs of consecutive ``cpus``, as even as possible (the first ones get
    one more when they do not divide); None when there are fewer CPUs than tasks (binding
    would stack tasks on a CPU while others stay free)."""
    cpus = sorted(cpus)
    if tasks < 1 or len(cpus) < tasks:
        return None
    size, extra = divmod(len(cpus), tasks)
    plan, start = [], 0
    for i in range(tasks):
        end = start + size + (1 if i < extra else 0)
        plan.append(tuple(cpus[start:end]))
        start = end
    return plan


@contextlib.contextmanager
def started_on(cpus: Sequence[int] | None) -> Iterator[None]:
    """Within the block, processes this thread starts inherit the affinity ``cpus`` (None: as
    they would anyway). Only the calling thread is bound, and only until the block ends: a
    child inherits its parent thread's mask at fork, with no window where it runs unbound."""
    if not cpus:
        yield
        return
    previous = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, cpus)
    except OSError:  # the CPUs were taken away since the plan (cgroup cpuset): start unbound
        yield
        return
    try:
        yield
    finally:
        os.sched_setaffinity(0, previous)


def describe(cpus: Sequence[int]) -> str:
    """``"cpu 3"`` or ``"cpus 0-3"`` / ``"cpus 0,2,4"`` for a run of CPUs."""
    cpus = sorted(cpus)
    if len(cpus) == 1:
        return f"cpu {cpus[0]}"
    if cpus == list(range(cpus[0], cpus[-1] + 1)):
        return f"cpus {cpus[0]}-{cpus[-1]}"
    return "cpus " + ",".join(map(str, cpus))
