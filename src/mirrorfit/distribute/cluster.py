"""Which processes make up a training job and which one this is: one frozen ``Cluster`` value.

A cluster comes from ``TF_CONFIG`` (what ``mirrorfit launch``, Kubeflow's ``TFJob`` and hand-made
manifests set), else from SLURM's environment under ``srun``, else there is none (one process).

Pure Python on purpose: the CLI resolves and checks the cluster before TensorFlow loads
(seconds), so a bad ``TF_CONFIG`` fails at once with one line. Only :meth:`Cluster.tf_resolver`
imports TensorFlow.

Roles follow TensorFlow's conventions (``tensorflow/python/distribute/multi_worker_util.py``):

- multi-worker (no ``ps`` job): every task trains. A ``chief`` job, if present, is one more
  worker that comes *first*: TF gives it id 0 and ``worker i`` id ``i + 1``, and it is the chief.
  Without a ``chief`` job, ``worker 0`` is the chief. ``mirrorfit launch`` and SLURM use the
  latter layout; a Kubeflow ``TFJob`` with a ``Chief`` replica the former. Both train the same.
- parameter-server (a ``ps`` job): the ``chief`` is the coordinator (it schedules steps and does
  not compute them), ``worker`` and ``ps`` tasks only serve. A ``chief`` is required.

An ``evaluator`` task (TF's side-car evaluation) is not supported and is refused by name.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Mapping

from mirrorfit.errors import ConfigError

# Seconds to wait for the other tasks (start-up, each collective): a step of a ResNet on a slow
# host stays far below.
DEFAULT_COLLECTIVE_TIMEOUT_S = 300.0

TASK_TYPES = ("worker", "ps", "chief")
SOURCES = ("TF_CONFIG", "SLURM", "launch")
SLURM_PORT_BASE = 8888  # as SlurmClusterResolver: task k on a node listens on 8888 + k
SLURM_PORT_BASE_ENV = "MIRRORFIT_SLURM_PORT_BASE"  # override, e.g. when two jobs share nodes
# Most tasks (so nodes) of a SLURM step: far above any gRPC cluster TF runs, yet their names fit
# in a few MB, so a corrupt "n[1-99999999]" fails at once instead of taking ~7 GB.
MAX_SLURM_TASKS = 65_536

_TF_CONFIG_EXAMPLE = ('{"cluster": {"worker": ["host0:2222", "host1:2222"]}, '
                      '"task": {"type": "worker", "index": 0}}')


@dataclass(frozen=True)
class Cluster:
    """The tasks of a job (``"host:port"`` each) and which of them this process is.

    ``workers``: the worker tasks; ``ps``: parameter servers; ``chief``: a separate chief task
    (the coordinator in parameter-server mode, an extra first worker otherwise);
    ``task_type``/``task_index``: this process; ``source``: where the description came from.
    Every field is checked on construction; a bad one raises :class:`ConfigError`.
    """

    workers: tuple[str, ...]
    ps: tuple[str, ...] = ()
    chief: str | None = None
    task_type: str = "worker"
    task_index: int = 0
    source: str = "TF_CONFIG"

    def __post_init__(self) -> None:
        # Lists from JSON become tuples, so the value stays hashable and immutable.
        object.__setattr__(self, "workers", tuple(self.workers))
        object.__setattr__(self, "ps", tuple(self.ps))
        where = self.source
        if self.source not in SOURCES:
            raise ConfigError(f"cluster source {self.source!r} is not one of {', '.join(SOURCES)}")
        if self.task_type not in TASK_TYPES:
            hint = ("; mirrorfit has no side-car evaluator: drop that task, the chief "
                    "evaluates" if self.task_type == "evaluator" else "")
            raise ConfigError(f"{where}: task type {self.task_type!r} is not one of "
                              f"{', '.join(TASK_TYPES)}{hint}")
        if not self.workers and self.chief is None:
            raise ConfigError(f"{where}: the cluster has no worker; list at least one "
                              "'host:port' under cluster.worker")
        if self.ps and self.chief is None:
            raise ConfigError(f"{where}: parameter servers need a chief task to coordinate "
                              "them; add cluster.chief with one 'host:port'")
        if self.ps and not self.workers:
            raise ConfigError(f"{where}: parameter servers but no worker to compute the steps; "
                              "list at least one 'host:port' under cluster.worker")
        jobs = {"chief": () if self.chief is None else (self.chief,), "worker": self.workers,
                "ps": self.ps}
        seen: dict[str, str] = {}
        for job, addresses in jobs.items():
            for i, address in enumerate(addresses):
                _check_address(address, f"{where} cluster.{job}[{i}]")
                if address in seen:
                    raise ConfigError(f"{where}: {address!r} is both {seen[address]} and "
                                      f"{job} {i}; give every task its own host:port")
                seen[address] = f"{job} {i}"
        index = self.task_index
        if isinstance(index, bool) or not isinstance(index, int):
            raise ConfigError(f"{where}: task index {index!r} is not an integer; e.g. 0")
        if not 0 <= index < len(jobs[self.task_type]):
            count = len(jobs[self.task_type])
            valid = f"0..{count - 1}" if count else "none: the job is empty"
            raise ConfigError(f"{where}: task {self.task_type} {index} is not in the cluster "
                              f"({count} {self.task_type} task(s), valid indices {valid}); "
                              "fix task.index or the cluster's list")

    @property
    def mode(self) -> str:
        """``"parameter-server"`` when there are parameter servers, else ``"multi-worker"``."""
        return "parameter-server" if self.ps else "multi-worker"

    @property
    def is_chief(self) -> bool:
        """The chief task if there is one, else worker 0: the task that writes outputs."""
        if self.chief is not None:
            return self.task_type == "chief"
        return self.task_type == "worker" and self.task_index == 0

    @property
    def num_workers(self) -> int:
        """Tasks that compute training steps: the workers, plus the chief in multi-worker mode
        (TF counts a ``chief`` job as a worker there, not in parameter-server mode)."""
        extra = 1 if self.chief is not None and not self.ps else 0
        return len(self.workers) + extra

    @property
    def worker_rank(self) -> int | None:
        """This task's position among the computing tasks, ``0..num_workers - 1`` (TF's
        ``id_in_cluster``: the chief first, if it computes); None for ps and the coordinator."""
        if self.task_type == "ps" or (self.task_type == "chief" and self.ps):
            return None
        if self.task_type == "chief":
            return 0
        return self.task_index + (1 if self.chief is not None and not self.ps else 0)

    def task_name(self) -> str:
        """``"worker 1"``, ``"ps 0"`` or ``"chief"``: the name used in output and errors."""
        return "chief" if self.task_type == "chief" else f"{self.task_type} {self.task_index}"

    def describe(self) -> str:
        """One line for logs, e.g. ``"worker 1 of 2 (TF_CONFIG)"``."""
        if self.ps:
            extra = f"{len(self.workers)} worker(s), {len(self.ps)} ps and a chief"
            role = {"chief": "chief (coordinator)", "worker": f"worker {self.task_index}",
                    "ps": f"ps {self.task_index}"}[self.task_type]
            return f"{role} of {extra} ({self.source})"
        if self.chief is None:
            return f"worker {self.task_index} of {len(self.workers)} ({self.source})"
        return f"{self.task_name()}, rank {self.worker_rank} of {self.num_workers} ({self.source})"

    def address(self, task_type: str, index: int = 0) -> str:
        """The ``"host:port"`` of task ``task_type`` ``index``; ValueError if there is none."""
        jobs = self._jobs()
        if task_type not in jobs or not 0 <= index < len(jobs[task_type]):
            raise ValueError(f"no task {task_type} {index} in this cluster "
                             f"({', '.join(f'{len(v)} {k}' for k, v in jobs.items())})")
        return jobs[task_type][index]

    def tf_config(self) -> dict:
        """The ``TF_CONFIG`` dict for this task (``json.dumps`` it into the environment)."""
        return {"cluster": {job: list(tasks) for job, tasks in self._jobs().items()},
                "task": {"type": self.task_type, "index": self.task_index}}

    def tf_resolver(self):
        """A ``tf.distribute.cluster_resolver.SimpleClusterResolver`` for this task (gRPC).

        Imports TensorFlow (the only place in this module that does).
        """
        import tensorflow as tf

        spec = tf.train.ClusterSpec({job: list(t) for job, t in self._jobs().items()})
        return tf.distribute.cluster_resolver.SimpleClusterResolver(
            spec, task_type=self.task_type, task_id=self.task_index, rpc_layer="grpc")

    def _jobs(self) -> dict[str, tuple[str, ...]]:
        """The non-empty jobs, in TF's order of roles: chief, worker, ps."""
        jobs = {"chief": () if self.chief is None else (self.chief,), "worker": self.workers,
                "ps": self.ps}
        return {job: tasks for job, tasks in jobs.items() if tasks}


def resolve_cluster(environ: Mapping[str, str] | None = None) -> Cluster | None:
    """The cluster this process belongs to, or None for a single-process run.

    ``TF_CONFIG`` wins when set (and not blank); else SLURM's step environment when ``srun``
    started more than one task; else None. ``environ`` defaults to ``os.environ``.
    Raises :class:`ConfigError` (one line: the bad value and the fix) for malformed input.
    """
    env = os.environ if environ is None else environ
    text = env.get("TF_CONFIG", "")
    if text.strip():  # an empty TF_CONFIG (a template left blank) means "not set", as unset
        return _from_tf_config(text)
    return _from_slurm(env)


def _from_tf_config(text: str) -> Cluster:
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"TF_CONFIG is not valid JSON ({e}); set it like {_TF_CONFIG_EXAMPLE}"
                          " or unset it") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"TF_CONFIG must be a JSON object, got {text.strip()[:60]!r}; set it "
                          f"like {_TF_CONFIG_EXAMPLE}")
    cluster, task = raw.get("cluster"), raw.get("task")
    if not isinstance(cluster, dict) or not cluster:
        raise ConfigError(f"TF_CONFIG has no cluster (got {cluster!r}); add "
                          '"cluster": {"worker": ["host:port", ...]}')
    if not isinstance(task, dict) or "type" not in task:
        raise ConfigError(f"TF_CONFIG has no task (got {task!r}); add "
                          '"task": {"type": "worker", "index": N} for this process')
    rpc = raw.get("rpc_layer", "grpc")
    if rpc not in ("grpc", "", None):
        raise ConfigError(f"TF_CONFIG rpc_layer {rpc!r} is not supported; use \"grpc\" or drop it")
    jobs: dict[str, list[str]] = {}
    for job, tasks in cluster.items():
        if job not in TASK_TYPES:
            hint = " (mirrorfit has no side-car evaluator)" if job == "evaluator" else ""
            raise ConfigError(f"TF_CONFIG cluster has a job {job!r}{hint}; jobs are "
                              f"{', '.join(TASK_TYPES)}")
        # TF also allows {index: address} dicts for sparse jobs; a dense list is all we need.
        if not isinstance(tasks, list) or not all(isinstance(t, str) for t in tasks):
            raise ConfigError(f"TF_CONFIG cluster.{job} must be a list of \"host:port\" strings, "
                              f"got {tasks!r}")
        jobs[job] = tasks
    chiefs = jobs.get("chief", [])
    if len(chiefs) > 1:
        raise ConfigError(f"TF_CONFIG cluster.chief lists {len(chiefs)} tasks {chiefs}; a job "
                          "has at most one chief (make the others workers)")
    index = task.get("index", 0)
    # templated manifests give "1"
    if isinstance(index, str) and index.strip().isdecimal() and index.strip().isascii():
        index = int(index)
    if isinstance(index, bool) or not isinstance(index, int):
        raise ConfigError(f"TF_CONFIG task.index {index!r} is not an integer; e.g. 0")
    return Cluster(workers=tuple(jobs.get("worker", ())), ps=tuple(jobs.get("ps", ())),
                   chief=chiefs[0] if chiefs else None, task_type=task["type"],
                   task_index=index, source="TF_CONFIG")


def _from_slurm(env: Mapping[str, str]) -> Cluster | None:
    # The step variables are set by srun for each task it starts (what SlurmClusterResolver
    # reads). The job-level SLURM_NTASKS alone is also set in the batch script itself, where
    # one process runs: treating that as task 0 of N would wait forever for the others.
    ntasks_text = env.get("SLURM_STEP_NUM_TASKS")
    if ntasks_text is None:
        return None
    ntasks = _slurm_int(env, "SLURM_STEP_NUM_TASKS", minimum=1)
    if ntasks == 1:
        return None
    if ntasks > MAX_SLURM_TASKS:
        raise ConfigError(f"SLURM: SLURM_STEP_NUM_TASKS={ntasks} is more than mirrorfit's cap "
                          f"of {MAX_SLURM_TASKS} tasks per job; run fewer tasks (srun -n)")
    rank = _slurm_int(env, "SLURM_PROCID", minimum=0)
    nodes_var = _first_set(env, "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
    tpn_var = _first_set(env, "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
    bound = f"SLURM_STEP_NUM_TASKS={ntasks} (each node of a step runs at least one task)"
    hosts = expand_hostlist(env[nodes_var], nodes_var, max_hosts=ntasks, bound=bound)
    per_node = expand_tasks_per_node(env[tpn_var], tpn_var, max_nodes=ntasks, bound=bound)
    if len(per_node) != len(hosts):
        raise ConfigError(f"SLURM: {nodes_var} names {len(hosts)} node(s) but {tpn_var}="
                          f"{_shown(env[tpn_var])} gives {len(per_node)}; run under srun")
    base = _slurm_int(env, SLURM_PORT_BASE_ENV, minimum=1) if SLURM_PORT_BASE_ENV in env \
        else SLURM_PORT_BASE
    # As SlurmClusterResolver: nodes sorted by name, consecutive ports on each node, and
    # SLURM_PROCID r is the r-th address (SLURM's default block distribution). Counted before
    # the addresses are made: a per-node count like "99999999" would make that many.
    placed = dict(zip(hosts, per_node))
    if sum(placed.values()) != ntasks:
        raise ConfigError(f"SLURM: SLURM_STEP_NUM_TASKS={ntasks} but {tpn_var}="
                          f"{_shown(env[tpn_var])} places {sum(placed.values())} task(s); run "
                          "under srun")
    addresses = [(host, k) for host, n in sorted(placed.items()) for k in range(n)]
    if rank >= ntasks:
        raise ConfigError(f"SLURM: SLURM_PROCID={rank} is not below SLURM_STEP_NUM_TASKS="
                          f"{ntasks}; run under srun")
    if base + max(k for _, k in addresses) > 65535:
        raise ConfigError(f"SLURM: port base {base} + tasks per node exceeds 65535; set "
                          f"{SLURM_PORT_BASE_ENV} lower, e.g. 8888")
    host, local = addresses[rank]
    node, localid = env.get("SLURMD_NODENAME"), env.get("SLURM_LOCALID")
    if node and localid is not None and (node.split(".")[0] != host.split(".")[0]
                                         or localid.strip() != str(local)):
        raise ConfigError(f"SLURM: task {rank} runs on {node} as local task {localid} but the "
                          f"block layout puts it on {host} as {local}; use srun's default "
                          "--distribution=block")
    return Cluster(workers=tuple(f"{h}:{base + k}" for h, k in addresses), task_type="worker",
                   task_index=rank, source="SLURM")


def expand_hostlist(hostlist: str, name: str = "SLURM_STEP_NODELIST",
                    max_hosts: int = MAX_SLURM_TASKS, bound: str | None = None) -> list[str]:
    """``"n[1-2],m5,o[03-04,6]"`` -> ``["n1", "n2", "m5", "o03", "o04", "o6"]``, in order.

    The grammar and output of TF's ``slurm_cluster_resolver.expand_hostlist`` (zero padding
    kept, no sorting or deduplication); rewritten because importing TF's takes seconds and TF's
    checks are ``assert``s. Raises :class:`ConfigError` naming ``name`` for a malformed list
    or one of more than ``max_hosts`` names, counted before any is made (``"n[1-99999999]"``
    fails at once); ``bound`` says where the limit comes from, e.g. ``"SLURM_STEP_NUM_TASKS=4"``.
    """
    bad = ConfigError(f"{name}={_shown(hostlist)} is not a SLURM hostlist like "
                      "'node[01-04],gpu7'; run under srun, which sets it")
    parts, current, depth = [], "", 0
    for c in hostlist:  # split at commas outside brackets ("o[3-4,6],m5")
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
    plan: list[tuple[str, int | None, int, int]] = []  # (prefix, digits or None, first, last)
    for part in parts:
        m = re.fullmatch(r"([^,\[\]\s]*)(?:\[([^\]]+)\])?", part)
        if m is None or not part:
            raise bad
        prefix, ranges = m.group(1), m.group(2)
        if ranges is None:
            plan.append((prefix, None, 0, 0))
            continue
        for piece in ranges.split(","):
            lo, _, hi = piece.partition("-")
            hi = hi or lo
            # 64 digits: past int()'s 4300-digit limit would be a ValueError, not one line
            if not all(t.isascii() and t.isdecimal() and len(t) <= 64 for t in (lo, hi)) \
                    or int(hi) < int(lo):
                raise bad
            plan.append((prefix, len(lo), int(lo), int(hi)))  # zero padding kept: len(lo)
    _check_count(sum(hi - lo + 1 for *_, lo, hi in plan), max_hosts, bound, name, hostlist)
    return [prefix + ("" if width is None else str(i).zfill(width))
            for prefix, width, lo, hi in plan for i in range(lo, hi + 1)]


def expand_tasks_per_node(text: str, name: str = "SLURM_STEP_TASKS_PER_NODE",
                          max_nodes: int = MAX_SLURM_TASKS, bound: str | None = None) -> list[int]:
    """``"3(x2),2,1"`` -> ``[3, 3, 2, 1]`` (TF's ``expand_tasks_per_node``); ConfigError for a
    malformed list or one for more than ``max_nodes`` nodes (counted before expanding)."""
    counts: list[tuple[int, int]] = []  # (tasks on a node, nodes)
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d{1,64})(?:\(x(\d{1,64})\))?\s*", part)
        if m is None:
            raise ConfigError(f"{name}={_shown(text)} is not a SLURM tasks-per-node list like "
                              "'2(x3),1'; run under srun, which sets it")
        counts.append((int(m.group(1)), int(m.group(2) or 1)))
    _check_count(sum(n for _, n in counts), max_nodes, bound, name, text)
    return [tasks for tasks, n in counts for _ in range(n)]


def _check_count(nodes: int, limit: int, bound: str | None, name: str, text: str) -> None:
    if nodes > limit:
        bound = bound or (f"mirrorfit's cap of {limit}" if limit == MAX_SLURM_TASKS else limit)
        raise ConfigError(f"{name}={_shown(text)} names {nodes} nodes, more than {bound}; fix "
                          f"{name} or run under srun, which sets it")


def _shown(text: str, keep: int = 60) -> str:
    """``repr(text)`` cut to ``keep`` characters: a SLURM list may be kilobytes of ranges."""
    return repr(text) if len(text) <= keep else f"{text[:keep]!r}... ({len(text)} chars)"


def _check_address(address: object, where: str) -> None:
    fix = "write it as host:port, e.g. 'worker-0.trainer:2222' or '10.0.0.5:2222'"
    if not isinstance(address, str):
        raise ConfigError(f"{where} is {address!r}, not a string; {fix}")
    m = re.fullmatch(r"(\[[0-9A-Fa-f:.]+\]|[^\s:/\[\]]+):(\d{1,5})", address)
    if m is None:
        raise ConfigError(f"{where} {address!r} is not host:port; {fix}")
    if not 1 <= int(m.group(2)) <= 65535:
        raise ConfigError(f"{where} {address!r}: port {m.group(2)} is not in 1..65535; {fix}")


def _first_set(env: Mapping[str, str], *names: str) -> str:
    for name in names:
        if env.get(name, "").strip():
            return name
    raise ConfigError(f"SLURM: none of {', '.join(names)} is set; run the command under srun")


def _slurm_int(env: Mapping[str, str], name: str, minimum: int) -> int:
    text = env.get(name)
    if text is None or not (text.strip().isascii() and text.strip().isdecimal()) \
            or int(text) < minimum:
        raise ConfigError(f"{name}={text!r} is not an integer >= {minimum}; run under srun, "
                          "which sets it" if name.startswith("SLURM") else
                          f"{name}={text!r} is not an integer >= {minimum}; e.g. 8888")
    return int(text)


__all__ = ["Cluster", "resolve_cluster", "expand_hostlist", "expand_tasks_per_node",
           "SLURM_PORT_BASE", "SLURM_PORT_BASE_ENV", "MAX_SLURM_TASKS"]


def cluster_for(strategy: str, environ: Mapping[str, str] | None = None) -> Cluster | None:
    """The cluster this process belongs to, for ``--strategy multi-worker`` or
    ``parameter-server`` (None for the one-process strategies); ConfigError when such a
    strategy finds no cluster, or one laid out for the other."""
    cluster = resolve_cluster(environ)
    if strategy not in ("multi-worker", "parameter-server"):
        if cluster is not None and cluster.num_workers + len(cluster.ps) > 1:
            # Every task would train its own copy and write the same outputs.
            raise ConfigError(f"{cluster.source} describes a cluster ({cluster.describe()}) but "
                              f"--strategy {strategy} trains alone; pass --strategy "
                              f"{cluster.mode}, or unset TF_CONFIG for a one-process run")
        return None
    if cluster is None:
        raise ConfigError(f"--strategy {strategy} needs a cluster: set TF_CONFIG, run under "
                          f"SLURM with srun, or start it with `mirrorfit launch --workers N -- "
                          f"mirrorfit train --strategy {strategy} ...`")
    if cluster.mode != strategy:
        raise ConfigError(f"--strategy {strategy}, but the cluster ({cluster.describe()}) is "
                          f"laid out for {cluster.mode}; use --strategy {cluster.mode}")
    return cluster
