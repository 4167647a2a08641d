"""Give each worker that ``mirrorfit launch`` starts on this host cores of its own (hyperthread
siblings together, as ``mpirun --bind-to core``). Linux only (``sched_*`` and sysfs
topology). (why: docs/architecture.md#cpu-binding)
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator, Sequence

_SIBLINGS = "/sys/devices/system/cpu/cpu{}/topology/thread_siblings_list"


def available_cores() -> list[tuple[int, ...]] | None:
    """The CPUs this process may run on, grouped by physical core (hyperthread siblings
    together), in CPU order; None where the OS cannot bind (not Linux)."""
    if not (hasattr(os, "sched_getaffinity") and hasattr(os, "sched_setaffinity")):
        return None
    allowed = os.sched_getaffinity(0)
    cores: dict[tuple[int, ...], None] = {}
    for cpu in sorted(allowed):
        try:
            with open(_SIBLINGS.format(cpu)) as f:
                siblings = parse_cpu_list(f.read()) & allowed
        except (OSError, ValueError):  # no sysfs topology: each CPU counts as a core
            siblings = {cpu}
        cores[tuple(sorted(siblings or {cpu}))] = None
    return list(cores)


def usable_cpus() -> int:
    """How many CPUs this process may run on: its affinity mask, which a launcher's binding,
    ``taskset`` or a container's cpuset narrows (``os.cpu_count()`` counts the whole host);
    ``os.cpu_count()`` where the OS cannot tell."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def threads_note(threads: int | None) -> str | None:
    """A warning when ``--threads-per-worker`` asks for more TensorFlow threads than the CPUs
    this process may run on (a bound worker's share): they would take turns on them, each
    step as slow as the most delayed thread; None when they fit or TF sizes its pools."""
    cpus = usable_cpus()
    if not threads or threads <= cpus:
        return None
    return (
        f"--threads-per-worker {threads} is more than the {cpus} CPU(s) this process may "
        f"run on: its threads will take turns on them; --threads-per-worker {cpus} fits"
    )


def parse_cpu_list(text: str) -> set[int]:
    """``"0-3,8"`` (the kernel's CPU list format) -> {0, 1, 2, 3, 8}."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def plan_cpus(cores: Sequence[Sequence[int]], tasks: int) -> list[tuple[int, ...]] | None:
    """``tasks`` disjoint runs of consecutive ``cores`` (each core with all its CPUs), as even
    as possible (the first ones get one more core when they do not divide); None when there
    are fewer cores than tasks (two tasks would share a core while others stay free)."""
    if tasks < 1 or len(cores) < tasks:
        return None
    size, extra = divmod(len(cores), tasks)
    plan, start = [], 0
    for i in range(tasks):
        end = start + size + (1 if i < extra else 0)
        plan.append(tuple(sorted(cpu for core in cores[start:end] for cpu in core)))
        start = end
    return plan


@contextlib.contextmanager
def started_on(cpus: Sequence[int] | None) -> Iterator[bool]:
    """Within the block, processes this thread starts inherit the affinity ``cpus`` (None: as
    they would anyway); yields whether they do. Only the calling thread is bound, and only
    until the block ends: a child inherits its parent thread's mask at fork, with no window
    where it runs unbound."""
    if not cpus:
        yield False
        return
    previous = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, cpus)
    except OSError:  # the CPUs were taken away since the plan (cgroup cpuset): start unbound
        yield False
        return
    try:
        yield True
    finally:
        # The child exists by now: a cpuset that shrank under us must not turn into a
        # failed start (and an orphaned task); the launcher then stays on the child's CPUs.
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, previous)


def describe(cpus: Sequence[int]) -> str:
    """``"cpu 3"`` or ``"cpus 0-3"`` / ``"cpus 0,2,4"`` for a run of CPUs."""
    cpus = sorted(cpus)
    if len(cpus) == 1:
        return f"cpu {cpus[0]}"
    if cpus == list(range(cpus[0], cpus[-1] + 1)):
        return f"cpus {cpus[0]}-{cpus[-1]}"
    return "cpus " + ",".join(map(str, cpus))
