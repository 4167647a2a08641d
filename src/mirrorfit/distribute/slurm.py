"""SLURM's step environment -> a :class:`~mirrorfit.distribute.cluster.Cluster` (``srun`` with
more than one task), as TF's ``SlurmClusterResolver`` reads it, in plain Python.

Every count in SLURM's compressed lists is bounded before anything is expanded: a corrupt
``n[1-99999999]`` is one ConfigError line at once, never gigabytes of names.
"""

from __future__ import annotations

import re
from typing import Mapping

from mirrorfit.errors import ConfigError

SLURM_PORT_BASE = 8888  # as SlurmClusterResolver: task k on a node listens on 8888 + k
SLURM_PORT_BASE_ENV = "MIRRORFIT_SLURM_PORT_BASE"  # override, e.g. when two jobs share nodes
# Most tasks (so nodes) of a SLURM step: far above any gRPC cluster TF runs, yet their names fit
# in a few MB, so a corrupt "n[1-99999999]" fails at once instead of taking ~7 GB.
MAX_SLURM_TASKS = 65_536
MAX_HOST_NAME = 255  # characters, as DNS allows


def from_slurm(env: Mapping[str, str]) -> tuple[tuple[str, ...], int] | None:
    """(every task's "host:port", this task's rank) of the ``srun`` step this process runs in,
    or None outside one (or for a step of one task); ConfigError for an inconsistent one.
    :func:`mirrorfit.distribute.cluster.resolve_cluster` makes the Cluster."""
    ntasks = _step_tasks(env)
    if ntasks is None:
        return None
    rank = _slurm_int(env, "SLURM_PROCID", minimum=0)
    hosts, per_node, tpn_var = _step_nodes(env, ntasks)
    base = _port_base(env)
    addresses = _block_layout(dict(zip(hosts, per_node)), ntasks, tpn_var, env[tpn_var])
    if rank >= ntasks:
        raise ConfigError(
            f"SLURM: SLURM_PROCID={rank} is not below SLURM_STEP_NUM_TASKS={ntasks}; run under srun"
        )
    _check_ports(base, addresses)
    _check_this_task(env, rank, *addresses[rank])
    return tuple(f"{h}:{base + k}" for h, k in addresses), rank


def _step_tasks(env: Mapping[str, str]) -> int | None:
    """Tasks of the ``srun`` step (``SLURM_STEP_NUM_TASKS``, at most MAX_SLURM_TASKS), or None
    outside a step or for a step of one task."""
    # The step variables are set by srun for each task it starts (what SlurmClusterResolver
    # reads). The job-level SLURM_NTASKS alone is also set in the batch script itself, where
    # one process runs: treating that as task 0 of N would wait forever for the others.
    if env.get("SLURM_STEP_NUM_TASKS") is None:
        return None
    ntasks = _slurm_int(env, "SLURM_STEP_NUM_TASKS", minimum=1)
    if ntasks == 1:
        return None
    if ntasks > MAX_SLURM_TASKS:
        raise ConfigError(
            f"SLURM: SLURM_STEP_NUM_TASKS={ntasks} is more than mirrorfit's cap "
            f"of {MAX_SLURM_TASKS} tasks per job; run fewer tasks (srun -n)"
        )
    return ntasks


def _step_nodes(env: Mapping[str, str], ntasks: int) -> tuple[list[str], list[int], str]:
    """(the step's node names, tasks on each, the tasks-per-node variable's name), from the
    first node list and tasks-per-node list set; both bounded by ``ntasks``."""
    nodes_var = _first_set(env, "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
    tpn_var = _first_set(env, "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
    bound = f"SLURM_STEP_NUM_TASKS={ntasks} (each node of a step runs at least one task)"
    hosts = expand_hostlist(env[nodes_var], nodes_var, max_hosts=ntasks, bound=bound)
    per_node = expand_tasks_per_node(env[tpn_var], tpn_var, max_nodes=ntasks, bound=bound)
    if len(per_node) != len(hosts):
        raise ConfigError(
            f"SLURM: {nodes_var} names {len(hosts)} node(s) but {tpn_var}="
            f"{_shown(env[tpn_var])} gives {len(per_node)}; run under srun"
        )
    return hosts, per_node, tpn_var


def _port_base(env: Mapping[str, str]) -> int:
    """The port of local task 0 on each node: ``MIRRORFIT_SLURM_PORT_BASE``, else 8888."""
    if SLURM_PORT_BASE_ENV in env:
        return _slurm_int(env, SLURM_PORT_BASE_ENV, minimum=1)
    return SLURM_PORT_BASE


def _block_layout(
    placed: dict[str, int], ntasks: int, tpn_var: str, tpn_text: str
) -> list[tuple[str, int]]:
    """(node, local task) of every task in rank order, from ``placed`` (tasks per node name);
    ConfigError unless it places exactly ``ntasks``."""
    # As SlurmClusterResolver: nodes sorted by name, consecutive ports on each node, and
    # SLURM_PROCID r is the r-th address (SLURM's default block distribution). Counted before
    # the addresses are made: a per-node count like "99999999" would make that many.
    if sum(placed.values()) != ntasks:
        raise ConfigError(
            f"SLURM: SLURM_STEP_NUM_TASKS={ntasks} but {tpn_var}="
            f"{_shown(tpn_text)} places {sum(placed.values())} task(s); run "
            "under srun"
        )
    return [(host, k) for host, n in sorted(placed.items()) for k in range(n)]


def _check_ports(base: int, addresses: list[tuple[str, int]]) -> None:
    """ConfigError if the highest port (``base`` + the last local task's number) is past 65535."""
    if base + max(k for _, k in addresses) > 65535:
        raise ConfigError(
            f"SLURM: port base {base} + tasks per node exceeds 65535; set "
            f"{SLURM_PORT_BASE_ENV} lower, e.g. 8888"
        )


def _check_this_task(env: Mapping[str, str], rank: int, host: str, local: int) -> None:
    """ConfigError if SLURM says this task runs elsewhere (``SLURMD_NODENAME``,
    ``SLURM_LOCALID``) than the block layout puts it (``host``, local task ``local``)."""
    # Short names only: either side may be fully qualified (n1.cluster vs n1).
    node, localid = env.get("SLURMD_NODENAME"), env.get("SLURM_LOCALID")
    if (
        node
        and localid is not None
        and (node.split(".")[0] != host.split(".")[0] or localid.strip() != str(local))
    ):
        raise ConfigError(
            f"SLURM: task {rank} runs on {node} as local task {localid} but the "
            f"block layout puts it on {host} as {local}; use srun's default "
            "--distribution=block"
        )


def expand_hostlist(
    hostlist: str,
    name: str = "SLURM_STEP_NODELIST",
    max_hosts: int = MAX_SLURM_TASKS,
    bound: str | None = None,
) -> list[str]:
    """``"n[1-2],m5,o[03-04,6]"`` -> ``["n1", "n2", "m5", "o03", "o04", "o6"]``, in order, as TF's
    ``slurm_cluster_resolver.expand_hostlist`` (padding kept, no sorting or deduplication).
    :class:`ConfigError` naming ``name`` for a malformed list or more than ``max_hosts`` names
    (counted first); ``bound`` says where the limit comes from, e.g. ``"SLURM_STEP_NUM_TASKS=4"``.
    """
    bad = ConfigError(
        f"{name}={_shown(hostlist)} is not a SLURM hostlist like "
        "'node[01-04],gpu7'; run under srun, which sets it"
    )
    plan = [run for part in _split_hostlist(hostlist, bad) for run in _part_runs(part, bad)]
    _check_count(sum(hi - lo + 1 for *_, lo, hi in plan), max_hosts, bound, name, hostlist)
    _check_name_lengths(plan, name, hostlist)
    return [
        prefix + ("" if width is None else str(i).zfill(width))
        for prefix, width, lo, hi in plan
        for i in range(lo, hi + 1)
    ]


# One run of host names: (prefix, digits of the zero-padded number or None for a plain name,
# first number, last number).
_Run = tuple[str, int | None, int, int]


def _split_hostlist(hostlist: str, bad: ConfigError) -> list[str]:
    """``"o[3-4,6],m5"`` -> ``["o[3-4,6]", "m5"]``: split at the commas outside brackets;
    ``bad`` for nested or unbalanced brackets or a blank list."""
    parts, current, depth = [], "", 0
    for c in hostlist:
        if c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
        if depth not in (0, 1):
            raise bad
        if c == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += c
    parts.append(current)
    if depth or not hostlist.strip():
        raise bad
    return parts


def _part_runs(part: str, bad: ConfigError) -> list[_Run]:
    """``"o[03-04,6]"`` -> ``[("o", 2, 3, 4), ("o", 1, 6, 6)]``, ``"m5"`` -> ``[("m5", None, 0,
    0)]``; ``bad`` for anything else (a range only at the end of a name, as TF's grammar)."""
    m = re.fullmatch(r"([^,\[\]\s]*)(?:\[([^\]]+)\])?", part)
    if m is None or not part:
        raise bad
    prefix, ranges = m.group(1), m.group(2)
    if ranges is None:
        return [(prefix, None, 0, 0)]
    runs: list[_Run] = []
    for piece in ranges.split(","):
        lo, _, hi = piece.partition("-")
        hi = hi or lo
        # 64 digits: past int()'s 4300-digit limit would be a ValueError, not one line
        if not all(t.isascii() and t.isdecimal() and len(t) <= 64 for t in (lo, hi)) or int(
            hi
        ) < int(lo):
            raise bad
        runs.append((prefix, len(lo), int(lo), int(hi)))  # zero padding kept: len(lo)
    return runs


def _check_name_lengths(plan: list[_Run], name: str, hostlist: str) -> None:
    """ConfigError if a run would make a host name over MAX_HOST_NAME characters."""
    # A host name is at most 255 characters (DNS): a long prefix times many names is gigabytes.
    if any(
        len(prefix) + max(width or 0, len(str(hi))) > MAX_HOST_NAME for prefix, width, _, hi in plan
    ):
        raise ConfigError(
            f"{name}={_shown(hostlist)} makes a host name longer than "
            f"{MAX_HOST_NAME} characters; fix {name} or run under srun"
        )


def expand_tasks_per_node(
    text: str,
    name: str = "SLURM_STEP_TASKS_PER_NODE",
    max_nodes: int = MAX_SLURM_TASKS,
    bound: str | None = None,
) -> list[int]:
    """``"3(x2),2,1"`` -> ``[3, 3, 2, 1]`` (TF's ``expand_tasks_per_node``); ConfigError for a
    malformed list or one for more than ``max_nodes`` nodes (counted before expanding)."""
    counts: list[tuple[int, int]] = []  # (tasks on a node, nodes)
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d{1,64})(?:\(x(\d{1,64})\))?\s*", part)
        if m is None:
            raise ConfigError(
                f"{name}={_shown(text)} is not a SLURM tasks-per-node list like "
                "'2(x3),1'; run under srun, which sets it"
            )
        counts.append((int(m.group(1)), int(m.group(2) or 1)))
    _check_count(sum(n for _, n in counts), max_nodes, bound, name, text)
    return [tasks for tasks, n in counts for _ in range(n)]


def _check_count(nodes: int, limit: int, bound: str | None, name: str, text: str) -> None:
    if nodes > limit:
        bound = bound or (f"mirrorfit's cap of {limit}" if limit == MAX_SLURM_TASKS else limit)
        raise ConfigError(
            f"{name}={_shown(text)} names {nodes} nodes, more than {bound}; fix "
            f"{name} or run under srun, which sets it"
        )


def _shown(text: str, keep: int = 60) -> str:
    """``repr(text)`` cut to ``keep`` characters: a SLURM list may be kilobytes of ranges."""
    return repr(text) if len(text) <= keep else f"{text[:keep]!r}... ({len(text)} chars)"


def _first_set(env: Mapping[str, str], *names: str) -> str:
    for name in names:
        if env.get(name, "").strip():
            return name
    raise ConfigError(f"SLURM: none of {', '.join(names)} is set; run the command under srun")


def _slurm_int(env: Mapping[str, str], name: str, minimum: int) -> int:
    text = env.get(name)
    shown = repr(text) if text is None else _shown(text)
    if (
        text is None
        or not (text.strip().isascii() and text.strip().isdecimal())
        or len(text.strip()) > 18
        or int(text) < minimum
    ):  # 18 digits: no int() limit
        raise ConfigError(
            f"{name}={shown} is not an integer >= {minimum}; run under srun, which sets it"
            if name.startswith("SLURM")
            else f"{name}={shown} is not an integer >= {minimum}; e.g. 8888"
        )
    return int(text)


__all__ = [
    "from_slurm",
    "expand_hostlist",
    "expand_tasks_per_node",
    "SLURM_PORT_BASE",
    "SLURM_PORT_BASE_ENV",
    "MAX_SLURM_TASKS",
]
