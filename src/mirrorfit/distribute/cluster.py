"""Which processes make up a training job and which one this is: one frozen ``Cluster`` value,
from ``TF_CONFIG``, else SLURM's environment under ``srun`` (:mod:`mirrorfit.distribute.slurm`),
else none (one process). Roles follow TensorFlow's conventions: worker 0 is the chief unless
there is a ``chief`` job; with a ``ps`` job the ``chief`` is the coordinator (required); an
``evaluator`` is refused. Pure Python: only :meth:`Cluster.tf_resolver` imports TensorFlow.
(why: docs/architecture.md#the-cluster)
"""

from __future__ import annotations

import json
import os
import re
import socket
from dataclasses import dataclass
from typing import Mapping

from mirrorfit.distribute.slurm import from_slurm
from mirrorfit.errors import ConfigError

# Seconds to wait for the other tasks (start-up, each collective): a step of a ResNet on a slow
# host stays far below.
DEFAULT_COLLECTIVE_TIMEOUT_S = 300.0

TASK_TYPES = ("worker", "ps", "chief")
SOURCES = ("TF_CONFIG", "SLURM", "launch")

_TF_CONFIG_EXAMPLE = (
    '{"cluster": {"worker": ["host0:2222", "host1:2222"]}, "task": {"type": "worker", "index": 0}}'
)


@dataclass(frozen=True)
class Cluster:
    """The tasks of a job (``"host:port"`` each) and which of them this process is: ``workers``,
    ``ps``, ``chief`` (a separate chief task), ``task_type``/``task_index`` (this process),
    ``source`` (where the description came from). Checked on construction (:class:`ConfigError`).
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
        _check_roles(self.source, self.task_type)
        _check_shape(self.source, self.workers, self.ps, self.chief)
        jobs = _all_jobs(self.chief, self.workers, self.ps)
        _check_addresses(self.source, jobs)
        _check_task_index(self.source, self.task_type, self.task_index, len(jobs[self.task_type]))

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
            role = {
                "chief": "chief (coordinator)",
                "worker": f"worker {self.task_index}",
                "ps": f"ps {self.task_index}",
            }[self.task_type]
            return f"{role} of {extra} ({self.source})"
        if self.chief is None:
            return f"worker {self.task_index} of {len(self.workers)} ({self.source})"
        return f"{self.task_name()}, rank {self.worker_rank} of {self.num_workers} ({self.source})"

    def address(self, task_type: str, index: int = 0) -> str:
        """The ``"host:port"`` of task ``task_type`` ``index``; ValueError if there is none."""
        jobs = self._jobs()
        if task_type not in jobs or not 0 <= index < len(jobs[task_type]):
            raise ValueError(
                f"no task {task_type} {index} in this cluster "
                f"({', '.join(f'{len(v)} {k}' for k, v in jobs.items())})"
            )
        return jobs[task_type][index]

    def peers(self) -> list[tuple[str, str]]:
        """(name, "host:port") of every other task."""
        me = self.address(self.task_type, self.task_index)
        return [(name, address) for name, address in self._named() if address != me]

    def unreachable(self, *, timeout_s: float = 2.0) -> list[str]:
        """The other tasks whose port does not accept a connection now (to name, after a
        collective failed, the one that stopped answering): ``"worker 1 (host:port)"``."""
        gone = []
        for name, address in self.peers():
            host, _, port = address.rpartition(":")
            try:
                socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
            except OSError:
                gone.append(f"{name} ({address})")
        return gone

    def _named(self) -> list[tuple[str, str]]:
        return [
            ("chief" if job == "chief" else f"{job} {i}", address)
            for job, addresses in self._jobs().items()
            for i, address in enumerate(addresses)
        ]

    def tf_config(self) -> dict:
        """The ``TF_CONFIG`` dict for this task (``json.dumps`` it into the environment)."""
        return {
            "cluster": {job: list(tasks) for job, tasks in self._jobs().items()},
            "task": {"type": self.task_type, "index": self.task_index},
        }

    def tf_resolver(self):
        """A ``tf.distribute.cluster_resolver.SimpleClusterResolver`` for this task (gRPC).

        Imports TensorFlow (the only place in this module that does).
        """
        import tensorflow as tf

        spec = tf.train.ClusterSpec({job: list(t) for job, t in self._jobs().items()})
        return tf.distribute.cluster_resolver.SimpleClusterResolver(
            spec, task_type=self.task_type, task_id=self.task_index, rpc_layer="grpc"
        )

    def _jobs(self) -> dict[str, tuple[str, ...]]:
        """The non-empty jobs, in TF's order of roles: chief, worker, ps."""
        jobs = _all_jobs(self.chief, self.workers, self.ps)
        return {job: tasks for job, tasks in jobs.items() if tasks}


def resolve_cluster(environ: Mapping[str, str] | None = None) -> Cluster | None:
    """The cluster this process belongs to, or None for a single-process run: ``TF_CONFIG`` when
    set (not blank), else SLURM's step environment when ``srun`` started more than one task.
    ``environ`` defaults to ``os.environ``; malformed input is one-line :class:`ConfigError`.
    """
    env = os.environ if environ is None else environ
    text = env.get("TF_CONFIG", "")
    if text.strip():  # an empty TF_CONFIG (a template left blank) means "not set", as unset
        return _from_tf_config(text)
    found = from_slurm(env)
    if found is None:
        return None
    workers, rank = found
    return Cluster(workers=workers, task_type="worker", task_index=rank, source="SLURM")


def _from_tf_config(text: str) -> Cluster:
    """The Cluster ``TF_CONFIG`` (``text``, not blank) describes; ConfigError if malformed."""
    cluster, task = _tf_config_parts(_tf_config_object(text))
    jobs = _tf_config_jobs(cluster)
    chiefs = jobs.get("chief", [])
    if len(chiefs) > 1:
        raise ConfigError(
            f"TF_CONFIG cluster.chief lists {len(chiefs)} tasks {chiefs}; a job "
            "has at most one chief (make the others workers)"
        )
    index = _tf_config_index(task)
    return Cluster(
        workers=tuple(jobs.get("worker", ())),
        ps=tuple(jobs.get("ps", ())),
        chief=chiefs[0] if chiefs else None,
        task_type=task["type"],
        task_index=index,
        source="TF_CONFIG",
    )


def _tf_config_object(text: str) -> dict:
    """``TF_CONFIG`` parsed: a JSON object, else ConfigError."""
    try:
        raw = json.loads(text)
    except ValueError as e:  # JSONDecodeError, or an integer past int()'s 4,300 digits
        raise ConfigError(
            f"TF_CONFIG is not valid JSON ({e}); set it like {_TF_CONFIG_EXAMPLE} or unset it"
        ) from None
    if not isinstance(raw, dict):
        raise ConfigError(
            f"TF_CONFIG must be a JSON object, got {text.strip()[:60]!r}; set it "
            f"like {_TF_CONFIG_EXAMPLE}"
        )
    return raw


def _tf_config_parts(raw: dict) -> tuple[dict, dict]:
    """(``cluster``, ``task``) of a TF_CONFIG object: both present, and the RPC layer gRPC."""
    cluster, task = raw.get("cluster"), raw.get("task")
    if not isinstance(cluster, dict) or not cluster:
        raise ConfigError(
            f"TF_CONFIG has no cluster (got {cluster!r}); add "
            '"cluster": {"worker": ["host:port", ...]}'
        )
    if not isinstance(task, dict) or "type" not in task:
        raise ConfigError(
            f"TF_CONFIG has no task (got {task!r}); add "
            '"task": {"type": "worker", "index": N} for this process'
        )
    rpc = raw.get("rpc_layer", "grpc")
    if rpc not in ("grpc", "", None):
        raise ConfigError(f'TF_CONFIG rpc_layer {rpc!r} is not supported; use "grpc" or drop it')
    return cluster, task


def _tf_config_jobs(cluster: dict) -> dict[str, list[str]]:
    """TF_CONFIG's ``cluster``, checked: jobs of TASK_TYPES only, each a list of strings."""
    jobs: dict[str, list[str]] = {}
    for job, tasks in cluster.items():
        if job not in TASK_TYPES:
            hint = " (mirrorfit has no side-car evaluator)" if job == "evaluator" else ""
            raise ConfigError(
                f"TF_CONFIG cluster has a job {job!r}{hint}; jobs are {', '.join(TASK_TYPES)}"
            )
        # TF also allows {index: address} dicts for sparse jobs; a dense list is all we need.
        if not isinstance(tasks, list) or not all(isinstance(t, str) for t in tasks):
            raise ConfigError(
                f'TF_CONFIG cluster.{job} must be a list of "host:port" strings, got {tasks!r}'
            )
        jobs[job] = tasks
    return jobs


def _tf_config_index(task: dict) -> int:
    """``task.index`` (default 0) as an int; ConfigError if it is not one."""
    index = task.get("index", 0)
    # templated manifests give "1"
    if (
        isinstance(index, str)
        and index.strip().isdecimal()
        and index.strip().isascii()
        and len(index.strip()) <= 18
    ):
        index = int(index)
    if isinstance(index, bool) or not isinstance(index, int):
        raise ConfigError(f"TF_CONFIG task.index {index!r:.60} is not an integer; e.g. 0")
    return index


def _all_jobs(
    chief: str | None, workers: tuple[str, ...], ps: tuple[str, ...]
) -> dict[str, tuple[str, ...]]:
    """Every job, empty ones too, in TF's order of roles: chief, worker, ps."""
    return {"chief": () if chief is None else (chief,), "worker": workers, "ps": ps}


def _check_roles(source: str, task_type: str) -> None:
    """ConfigError for a source other than SOURCES or a task type other than TASK_TYPES."""
    if source not in SOURCES:
        raise ConfigError(f"cluster source {source!r} is not one of {', '.join(SOURCES)}")
    if task_type not in TASK_TYPES:
        hint = (
            "; mirrorfit has no side-car evaluator: drop that task, the chief evaluates"
            if task_type == "evaluator"
            else ""
        )
        raise ConfigError(
            f"{source}: task type {task_type!r} is not one of {', '.join(TASK_TYPES)}{hint}"
        )


def _check_shape(
    where: str, workers: tuple[str, ...], ps: tuple[str, ...], chief: str | None
) -> None:
    """ConfigError for a job with no task to compute, or parameter servers without a chief to
    coordinate them or workers to compute."""
    if not workers and chief is None:
        raise ConfigError(
            f"{where}: the cluster has no worker; list at least one "
            "'host:port' under cluster.worker"
        )
    if ps and chief is None:
        raise ConfigError(
            f"{where}: parameter servers need a chief task to coordinate "
            "them; add cluster.chief with one 'host:port'"
        )
    if ps and not workers:
        raise ConfigError(
            f"{where}: parameter servers but no worker to compute the steps; "
            "list at least one 'host:port' under cluster.worker"
        )


def _check_addresses(where: str, jobs: dict[str, tuple[str, ...]]) -> None:
    """ConfigError for an address that is not ``host:port`` or that two tasks share."""
    seen: dict[str, str] = {}
    for job, addresses in jobs.items():
        for i, address in enumerate(addresses):
            _check_address(address, f"{where} cluster.{job}[{i}]")
            if address in seen:
                raise ConfigError(
                    f"{where}: {address!r} is both {seen[address]} and "
                    f"{job} {i}; give every task its own host:port"
                )
            seen[address] = f"{job} {i}"


def _check_task_index(where: str, task_type: str, index: object, count: int) -> None:
    """ConfigError unless ``index`` is an int in ``0..count - 1`` (``count``: tasks of
    ``task_type``)."""
    if isinstance(index, bool) or not isinstance(index, int):
        raise ConfigError(f"{where}: task index {index!r} is not an integer; e.g. 0")
    if not 0 <= index < count:
        valid = f"0..{count - 1}" if count else "none: the job is empty"
        raise ConfigError(
            f"{where}: task {task_type} {index} is not in the cluster "
            f"({count} {task_type} task(s), valid indices {valid}); "
            "fix task.index or the cluster's list"
        )


def _check_address(address: object, where: str) -> None:
    fix = "write it as host:port, e.g. 'worker-0.trainer:2222' or '10.0.0.5:2222'"
    if not isinstance(address, str):
        raise ConfigError(f"{where} is {address!r}, not a string; {fix}")
    m = re.fullmatch(r"(\[[0-9A-Fa-f:.]+\]|[^\s:/\[\]]+):(\d{1,5})", address)
    if m is None:
        raise ConfigError(f"{where} {address!r} is not host:port; {fix}")
    if not 1 <= int(m.group(2)) <= 65535:
        raise ConfigError(f"{where} {address!r}: port {m.group(2)} is not in 1..65535; {fix}")


__all__ = [
    "Cluster",
    "resolve_cluster",
    "cluster_for",
    "check_strategy",
    "CLI_WORDS",
    "DEFAULT_COLLECTIVE_TIMEOUT_S",
]


def cluster_for(strategy: str, environ: Mapping[str, str] | None = None) -> Cluster | None:
    """The cluster this process belongs to, for ``--strategy multi-worker`` or
    ``parameter-server`` (None for the one-process strategies); ConfigError when such a
    strategy finds no cluster, or one laid out for the other."""
    return check_strategy(strategy, resolve_cluster(environ))


# check_strategy's refusals as the CLI words them: str.format templates of {strategy},
# {source}, {cluster} (its describe()) and {mode}. mirrorfit.setup() has its own (strategy=...).
CLI_WORDS = {
    "alone": "{source} describes a cluster ({cluster}) but --strategy {strategy} trains alone; "
    "pass --strategy {mode}, or unset TF_CONFIG for a one-process run",
    "missing": "--strategy {strategy} needs a cluster: set TF_CONFIG, run under SLURM with srun, "
    "or start it with `mirrorfit launch --workers N -- mirrorfit train --strategy {strategy} ...`",
    "mismatch": "--strategy {strategy}, but the cluster ({cluster}) is laid out for {mode}; "
    "use --strategy {mode}",
}


def check_strategy(
    strategy: str,
    cluster: Cluster | None,
    words: Mapping[str, str] = CLI_WORDS,
    error: type[ConfigError] = ConfigError,
) -> Cluster | None:
    """``cluster`` for strategy ``"multi-worker"`` or ``"parameter-server"``, None for any other
    (one process); ``error``, worded by ``words`` (see CLI_WORDS), when the two disagree."""
    if strategy not in ("multi-worker", "parameter-server"):
        if cluster is not None and cluster.num_workers + len(cluster.ps) > 1:
            # Every task would train its own copy and write the same outputs.
            raise error(words["alone"].format(**_wording_fields(strategy, cluster)))
        return None
    if cluster is None:
        raise error(words["missing"].format(strategy=strategy))
    if cluster.mode != strategy:
        raise error(words["mismatch"].format(**_wording_fields(strategy, cluster)))
    return cluster


def _wording_fields(strategy: str, cluster: Cluster) -> dict[str, str]:
    """The fields of a check_strategy template, for ``cluster``."""
    return {
        "strategy": strategy,
        "source": cluster.source,
        "cluster": cluster.describe(),
        "mode": cluster.mode,
    }
