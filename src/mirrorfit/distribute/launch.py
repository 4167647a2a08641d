"""``mirrorfit launch``: run every task of a multi-worker or parameter-server job on this host.

    mirrorfit launch --workers 2 -- mirrorfit train --strategy multi-worker --checkpoint-dir ckpt
    mirrorfit launch --workers 2 --ps 1 -- mirrorfit train --strategy parameter-server ...

Each task is COMMAND with its own ``TF_CONFIG`` on free loopback ports, in its own session
(signalled as a group), its output prefixed (:mod:`._output`), workers bound to cores
(:mod:`._cpu_binding`). The exit code is the chief's. A failed task restarts the group, at
most ``--max-restarts`` times. POSIX only. (docs/multi-worker.md#on-this-machine-mirrorfit-launch)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import IO, Sequence

from mirrorfit.distribute._cpu_binding import (
    available_cores,
    describe,
    plan_cpus,
    started_on,
    usable_cpus,
)
from mirrorfit.distribute._output import line_writer, start_streaming
from mirrorfit.distribute.cluster import Cluster
from mirrorfit.errors import EXIT_DIVERGED, EXIT_USAGE, ConfigError, MirrorfitError

DEFAULT_GRACE_S = 10.0  # seconds a task gets between SIGTERM and SIGKILL
DEFAULT_MAX_RESTARTS = 0
LOOPBACK = "127.0.0.1"
_POLL_S = 0.05  # how often task exits and signals are checked
_SETTLE_S = 2.0  # after a restartable failure: how long a peer's refusal may still come


def add_launch_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``launch`` command to ``subparsers`` (of ``mirrorfit``'s parser); return it."""
    p = subparsers.add_parser(
        "launch",
        help="run a multi-worker or parameter-server job on this host, one process per task",
        **_PARSER_TEXT,
    )
    _add_arguments(p)
    return p


_PARSER_TEXT = dict(
    description="Start N workers (and with --ps, a chief and M parameter servers) on this host, "
    "each running COMMAND with its own TF_CONFIG on free loopback ports; stream "
    "their output prefixed with the task; exit with the chief's code.",
    epilog="Restarted tasks resume from a checkpoint only if COMMAND has --checkpoint-dir, e.g. "
    "mirrorfit launch --workers 2 --max-restarts 3 -- mirrorfit train --strategy "
    "multi-worker --threads-per-worker 1 --checkpoint-dir ckpt",
)


def _add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of ``mirrorfit launch``, in ``--help``'s order, then COMMAND."""
    _add_task_counts(p)
    _add_restart_flags(p)
    _add_cpu_flags(p)
    p.add_argument(
        "task_command",
        nargs=argparse.REMAINDER,
        metavar="-- COMMAND ...",
        help="the command every task runs, after --",
    )


def _add_task_counts(p: argparse.ArgumentParser) -> None:
    """``--workers`` and ``--ps``: how many tasks of each job to start."""
    p.add_argument(
        "--workers",
        type=int,
        required=True,
        metavar="N",
        help="worker tasks (>= 1); without --ps, worker 0 is the chief",
    )
    p.add_argument(
        "--ps",
        type=int,
        default=0,
        metavar="M",
        help="parameter-server tasks (default 0); M >= 1 also starts a chief task, the coordinator",
    )


def _add_restart_flags(p: argparse.ArgumentParser) -> None:
    """``--max-restarts`` and ``--grace-s`` (seconds): restarting and stopping the tasks."""
    p.add_argument(
        "--max-restarts",
        type=int,
        default=DEFAULT_MAX_RESTARTS,
        metavar="R",
        help="restarts after a task dies, each of the whole group (a lone worker with --ps); "
        "pass --checkpoint-dir to COMMAND so training resumes (default "
        f"{DEFAULT_MAX_RESTARTS})",
    )
    p.add_argument(
        "--grace-s",
        type=float,
        default=DEFAULT_GRACE_S,
        metavar="S",
        help="seconds between SIGTERM and SIGKILL when stopping tasks (default "
        f"{DEFAULT_GRACE_S:g})",
    )


def _add_cpu_flags(p: argparse.ArgumentParser) -> None:
    """``--oversubscribe`` and ``--bind-cpus``: how the tasks share this host's CPUs."""
    p.add_argument(
        "--oversubscribe",
        action="store_true",
        help=f"start more than {TASKS_PER_CPU} tasks per CPU this launcher may use (at least "
        f"{MIN_TASK_BOUND} are always allowed); without it such a job is refused",
    )
    p.add_argument(
        "--bind-cpus",
        choices=("auto", "none"),
        default="auto",
        help="auto (default): without --ps, bind each worker to its own share of the cores "
        "this launcher may run on (hyperthreads of a core together), if there are at "
        "least as many cores as workers; none: let the OS place them",
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``mirrorfit launch`` on its own (``python -m mirrorfit.distribute.launch ...``)."""
    parser = argparse.ArgumentParser(prog="mirrorfit launch", **_PARSER_TEXT)
    _add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run_launch(args)
    except MirrorfitError as e:
        print(f"mirrorfit: error: {e}", file=sys.stderr)
        return EXIT_USAGE


def run_launch(args: argparse.Namespace) -> int:
    """Run the job described by parsed ``launch`` flags; return the chief's exit code.

    Raises :class:`ConfigError` (one line, before any task starts) for a bad flag.
    """
    launcher = Launcher(
        check_launch_args(args),
        workers=args.workers,
        ps=args.ps,
        max_restarts=args.max_restarts,
        grace_s=args.grace_s,
        bind_cpus=args.bind_cpus == "auto",
    )
    return launcher.run()


MAX_TASKS = 256  # TensorFlow processes on one host; planning 4,000 took 66 s before any start
# Tasks per CPU without --oversubscribe. A ps task and the coordinator mostly wait on RPCs and a
# worker waits on its all-reduces part of each step, so 2 per CPU still trains (2 workers, or
# 2 workers + ps + chief, on 2 CPUs); far beyond, every TensorFlow process gets a sliver of a
# core (256 on 2 CPUs: load 93 for 7 minutes). At least MIN_TASK_BOUND: the smallest
# parameter-server job (2 workers, a ps, the chief) runs on one CPU too.
TASKS_PER_CPU = 2
MIN_TASK_BOUND = 4


def check_launch_args(args: argparse.Namespace) -> list[str]:
    """Check parsed ``launch`` flags without starting anything; return the argv every task
    runs (see :func:`resolve_command`). Raises :class:`ConfigError` naming the flag."""
    command = list(args.task_command or ())
    if command[:1] == ["--"]:
        command = command[1:]
    for flag, value, minimum in (
        ("--workers", args.workers, 1),
        ("--ps", args.ps, 0),
        ("--max-restarts", args.max_restarts, 0),
    ):
        if value < minimum:
            raise ConfigError(
                f"{flag} must be >= {minimum}, got {value}; e.g. {flag} "
                f"{max(minimum, 1 if flag != '--workers' else 2)}"
            )
    if args.workers + args.ps > MAX_TASKS:
        raise ConfigError(
            f"--workers {args.workers} --ps {args.ps}: at most {MAX_TASKS} tasks "
            "on one host (each is a TensorFlow process); use a cluster scheduler "
            "(SLURM, Kubernetes) for more"
        )
    tasks, cpus = args.workers + args.ps + (1 if args.ps else 0), usable_cpus()
    bound = max(MIN_TASK_BOUND, TASKS_PER_CPU * cpus)
    if tasks > bound and not getattr(args, "oversubscribe", False):
        raise ConfigError(
            f"--workers {args.workers} --ps {args.ps} makes {tasks} tasks for the "
            f"{cpus} CPU(s) this launcher may use, more than {bound} "
            f"({TASKS_PER_CPU} per CPU): each TensorFlow process would get a "
            "sliver of a core; start fewer, or pass --oversubscribe to start them "
            "anyway"
        )
    if os.environ.get("MIRRORFIT_LAUNCH") == "1":
        raise ConfigError(
            "mirrorfit launch is running inside a task of another mirrorfit "
            "launch; nested launchers would make several clusters with a chief "
            "each: launch once"
        )
    if not math.isfinite(args.grace_s) or args.grace_s < 0:
        raise ConfigError(
            f"--grace-s must be a number of seconds >= 0, got {args.grace_s}; "
            f"e.g. --grace-s {DEFAULT_GRACE_S:g}"
        )
    return resolve_command(command)


def resolve_command(command: Sequence[str]) -> list[str]:
    """The argv to start for COMMAND, checked. A bare ``mirrorfit`` becomes this interpreter's
    ``python -m mirrorfit``, so tasks run the launcher's own installation even when another one
    (or none) is first on PATH."""
    if not command:
        raise ConfigError(
            "mirrorfit launch needs the command to run after --; e.g. mirrorfit "
            "launch --workers 2 -- mirrorfit train --strategy multi-worker"
        )
    exe = command[0]
    if exe == "mirrorfit":
        return [sys.executable, "-m", "mirrorfit", *command[1:]]
    if os.sep in exe:
        if not (os.path.isfile(exe) and os.access(exe, os.X_OK)):
            raise ConfigError(
                f"the command {exe!r} after -- is not an executable file; check the path"
            )
    elif shutil.which(exe) is None:
        raise ConfigError(
            f"the command {exe!r} after -- is not on PATH; give its full path or install it"
        )
    return list(command)


def free_ports(count: int, host: str = LOOPBACK) -> list[int]:
    """``count`` distinct ports free on ``host`` now. All are bound (port 0) at the same time so
    they differ; another program may still take one before the task binds it (rare)."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            s.bind((host, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def plan_cluster(
    workers: int, ps: int, ports: Sequence[int], host: str = LOOPBACK
) -> list[Cluster]:
    """One :class:`Cluster` per task, the chief first: without ``ps``, ``workers`` workers
    (worker 0 is the chief); with ``ps``, a chief (the coordinator), the workers, the ps tasks
    (TF's ParameterServerStrategy layout). ``ports``: ``workers + ps + (1 if ps else 0)``."""
    addresses = [f"{host}:{port}" for port in ports]
    chief = addresses.pop(0) if ps else None
    worker_addrs, ps_addrs = tuple(addresses[:workers]), tuple(addresses[workers:])
    roles = (
        ([("chief", 0)] if ps else [])
        + [("worker", i) for i in range(workers)]
        + [("ps", i) for i in range(ps)]
    )
    return [
        Cluster(
            workers=worker_addrs,
            ps=ps_addrs,
            chief=chief,
            task_type=kind,
            task_index=i,
            source="launch",
        )
        for kind, i in roles
    ]


class _Task:
    """One process of the job and the threads copying its output."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.name = cluster.task_name()
        self.cpus: tuple[int, ...] | None = None  # bound to these, if any
        self.proc: subprocess.Popen | None = None
        self.readers: list[threading.Thread] = []
        self.handled = False  # its exit has been acted on
        self._swept = False  # what it left in its process group has been killed

    def poll(self) -> int | None:
        if self.proc is None:
            return 0
        rc = self.proc.poll()
        if rc is not None and not self._swept:
            self._swept = True
            self.signal(signal.SIGKILL)  # what it started must not outlive it (same group)
        return rc

    def signal(self, sig: int) -> None:
        try:  # start_new_session: the group id is the task's pid
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass  # the group is gone already

    def join_output(self, timeout_s: float = 2.0) -> None:
        deadline = time.monotonic() + timeout_s
        for t in self.readers:
            t.join(max(0.0, deadline - time.monotonic()))


class Launcher:
    """Starts, watches, restarts and stops the tasks of one job; :meth:`run` returns the exit
    code. ``out``/``err`` (default: ``sys.stdout``/``sys.stderr``) receive the tasks' prefixed
    stdout/stderr; the launcher's own lines go to ``err``, starting ``mirrorfit launch:``.
    ``bind_cpus``: without ``ps``, each worker runs on its own share of the launcher's cores."""

    def __init__(
        self,
        command: Sequence[str],
        workers: int,
        ps: int = 0,
        max_restarts: int = DEFAULT_MAX_RESTARTS,
        grace_s: float = DEFAULT_GRACE_S,
        out: IO[str] | None = None,
        err: IO[str] | None = None,
        bind_cpus: bool = True,
    ) -> None:
        self.command, self.workers, self.ps = list(command), workers, ps
        self.bind_cpus = bind_cpus
        self.max_restarts, self.grace_s = max_restarts, grace_s
        self.out, self.err = out or sys.stdout, err or sys.stderr
        self.restarts = 0
        self._lock = threading.Lock()  # one line at a time on each stream
        self._signals: list[int] = []  # received by the launcher, in order
        self._started: list[_Task] = []

    def run(self) -> int:
        previous = self._install_signal_handlers()
        try:
            while True:
                if self._signals:  # arrived while a failed group was being stopped
                    return 128 + self._signals[0]
                restart, code = self._run_group()
                if not restart:
                    return code
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            for task in self._started:  # no path leaves a task behind
                if task.proc is not None and task.proc.poll() is None:
                    task.signal(signal.SIGKILL)
                    task.proc.wait()
            _join_all(self._started, 0.5)

    # -- one generation of the group ------------------------------------------------------
    def _run_group(self) -> tuple[bool, int]:
        """Run the group until the job ends (False, exit code) or must restart (True, 0)."""
        tasks = [
            _Task(c)
            for c in plan_cluster(
                self.workers, self.ps, free_ports(self.workers + self.ps + (1 if self.ps else 0))
            )
        ]
        first = tasks[0].cluster
        chief_note = "chief" if self.ps else "worker 0 (chief)"
        if self.bind_cpus and not self.ps and self.workers > 1:
            cores = available_cores()
            for task, share in zip(tasks, (cores and plan_cpus(cores, len(tasks))) or ()):
                task.cpus = share
            if cores is not None and tasks[0].cpus is None:
                self._say(
                    f"not binding workers to CPUs: {len(tasks)} workers, "
                    f"{len(cores)} core(s) this launcher may use"
                )
        places = ", ".join(
            f"{t.name} {first.address(t.cluster.task_type, t.cluster.task_index)}"
            + (f" ({describe(t.cpus)})" if t.cpus else "")
            for t in tasks
        )
        self._say(f"starting {len(tasks)} task(s): {places}; {chief_note} decides the exit code")
        for task in tasks:
            if self._signals and task is not tasks[0]:
                break  # signalled while starting them: start no more (the chief is started)
            self._start(task)
        chief = tasks[0]
        while True:
            if self._signals:
                return False, self._forward_signal(tasks, chief)
            exited = [t for t in tasks if not t.handled and t.poll() is not None]
            exited.sort(key=lambda t: _handling_order(t.proc.returncode, t is chief))
            for task in exited:
                task.handled = True
                task.join_output()  # its last lines (a traceback) come before ours
                rc = task.proc.returncode
                if task is chief and rc == 0:
                    return False, self._finish(tasks, chief)
                if rc == 0:
                    continue  # a multi-worker peer that is done; the chief decides
                outcome = self._on_failure(task, rc, tasks)
                if outcome is not None:
                    return outcome
            time.sleep(_POLL_S)

    def _on_failure(self, task: _Task, rc: int, tasks: list[_Task]) -> tuple[bool, int] | None:
        if rc not in (EXIT_USAGE, EXIT_DIVERGED):
            cause = self._refusal_soon(task, tasks)
            if cause is not None:  # this task's failure is its consequence (a lost peer)
                task, rc = cause, cause.proc.returncode
        what = f"{task.name} exited with {_describe(rc)}"
        everyone = f"all {len(tasks)} task(s)"
        if rc in (EXIT_USAGE, EXIT_DIVERGED):
            why = "a usage error" if rc == EXIT_USAGE else "a diverged run"
            self._say(f"{what} ({why}, which a restart would repeat); stopping {everyone}")
            self._stop(tasks)
            return False, rc
        if self.restarts >= self.max_restarts:
            self._say(
                f"{what}; no restarts left (--max-restarts {self.max_restarts}); stopping "
                f"{everyone}; exit code {_exit_code(rc)}"
            )
            self._stop(tasks)
            return False, _exit_code(rc)
        self.restarts += 1
        count = f"restart {self.restarts} of {self.max_restarts}"
        if self.ps and task.cluster.task_type == "worker":
            where = task.cluster.address("worker", task.cluster.task_index)
            self._say(
                f"{what}; restarting {task.name} alone at {where} ({count}); the chief "
                "retries its steps"
            )
            task.handled = False
            self._start(task)
            return None
        self._say(f"{what}; restarting {everyone} ({count})")
        self._stop(tasks)
        return True, 0

    def _refusal_soon(self, failed: _Task, tasks: list[_Task]) -> _Task | None:
        """Another task that ends with a usage error or a diverged run within
        :data:`_SETTLE_S` of ``failed``'s failure: a task that refused may still be tearing
        down (TensorFlow's takes about a second) when its peer, having lost it, ends first."""
        deadline = time.monotonic() + _SETTLE_S
        while time.monotonic() < deadline and not self._signals:
            others = [t for t in tasks if t is not failed and not t.handled]
            for t in others:
                if t.poll() in (EXIT_USAGE, EXIT_DIVERGED):
                    t.handled = True
                    t.join_output()
                    return t
            if all(t.poll() is not None for t in others):
                return None
            time.sleep(_POLL_S)
        return None

    def _finish(self, tasks: list[_Task], chief: _Task) -> int:
        """The chief succeeded: multi-worker peers get ``grace_s`` to end by themselves; tasks
        that only serve (ps, and workers under a coordinator) run forever and are stopped."""
        rest = [t for t in tasks if t is not chief]
        if not self.ps:
            deadline = time.monotonic() + self.grace_s
            while (
                any(t.poll() is None for t in rest)
                and time.monotonic() < deadline
                and not self._signals
            ):
                time.sleep(_POLL_S)
        self._stop(rest)
        return 0

    def _forward_signal(self, tasks: list[_Task], chief: _Task) -> int:
        sig = self._signals[0]
        live = [t for t in tasks if t.poll() is None]
        self._say(
            f"{signal.Signals(sig).name}: forwarding it to {len(live)} running task(s); "
            f"SIGKILL after {self.grace_s:g} s (a second signal: at once)"
        )
        self._stop(tasks, sig)
        return _exit_code(chief.proc.returncode)

    # -- processes ------------------------------------------------------------------------
    def _start(self, task: _Task) -> None:
        env = dict(
            os.environ,
            TF_CONFIG=json.dumps(task.cluster.tf_config()),
            MIRRORFIT_LAUNCH="1",
            MIRRORFIT_LAUNCH_RESTART=str(self.restarts),
        )
        env.setdefault("PYTHONUNBUFFERED", "1")  # else a killed task's last lines are lost
        try:
            with started_on(task.cpus) as bound:
                task.proc = subprocess.Popen(
                    self.command,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    start_new_session=True,
                    bufsize=0,
                )
        except OSError as e:
            raise ConfigError(
                f"cannot start {self.command[0]!r} ({e.strerror}); check the command after --"
            ) from None
        task._swept = False
        task.cpus = task.cpus if bound else None
        self._started.append(task)
        prefix = f"[{task.name}] "
        task.readers = [
            start_streaming(pipe, prefix, line_writer(stream, self._lock), name=f"{prefix}{kind}")
            for pipe, stream, kind in (
                (task.proc.stdout, self.out, "stdout"),
                (task.proc.stderr, self.err, "stderr"),
            )
        ]

    def _stop(self, tasks: list[_Task], sig: int = signal.SIGTERM) -> None:
        """Send ``sig`` to every running task's group, wait ``grace_s``, SIGKILL the rest."""
        live = [t for t in tasks if t.poll() is None]
        for t in live:
            t.signal(sig)
        seen = len(self._signals)
        deadline = time.monotonic() + self.grace_s
        while any(t.poll() is None for t in live) and time.monotonic() < deadline:
            if len(self._signals) > max(seen, 1):  # a second signal to the launcher: kill now
                break
            time.sleep(_POLL_S)
        for t in live:
            if t.poll() is None:
                t.signal(signal.SIGKILL)
            t.handled = True
        for t in live:
            t.proc.wait()
        _join_all(live, 2.0)

    # -- output ---------------------------------------------------------------------------
    def _say(self, text: str) -> None:
        with self._lock:
            self.err.write(f"mirrorfit launch: {text}\n")
            self.err.flush()

    # -- signals --------------------------------------------------------------------------
    def _install_signal_handlers(self) -> dict[int, object]:
        # Tasks run in their own sessions, so a terminal's Ctrl-C reaches only the launcher,
        # which forwards it once to every task.
        if threading.current_thread() is not threading.main_thread():
            return {}  # signal handlers can only be set there; callers handle signals
        previous = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, lambda signum, frame: self._signals.append(signum))
        return previous


def _join_all(tasks: list[_Task], timeout_s: float) -> None:
    """The tasks' last output, all within ``timeout_s`` together: one wait each (2 s each,
    one after the other) made a SIGTERM to a launch of 256 tasks take 444 s where something
    outside a task's group held its output open."""
    deadline = time.monotonic() + timeout_s
    for t in tasks:
        t.join_output(max(0.0, deadline - time.monotonic()))


def _describe(rc: int) -> str:
    """``"code 1"`` or ``"SIGKILL (-9)"`` for a Popen return code."""
    if rc >= 0:
        return f"code {rc}"
    try:
        return f"{signal.Signals(-rc).name} ({rc})"
    except ValueError:
        return f"signal {-rc} ({rc})"


def _handling_order(rc: int, chief: bool) -> int:
    """Which of the tasks that ended since the last look is handled first (lowest): a chief
    that succeeded ends the job whatever else ended with it; then a usage error or a diverged
    run, whoever's (its peer's "stopped answering" is its consequence, and must not restart
    the group: a usage error is 2 every time); then a worker's failure; a chief failing right
    after a worker died is usually the consequence: the worker is reported."""
    if chief and rc == 0:
        return 0
    if rc in (EXIT_USAGE, EXIT_DIVERGED):
        return 1
    return 3 if chief else 2


def _exit_code(rc: int | None) -> int:
    """A Popen return code as a process exit code: a death by signal N is 128 + N (shells')."""
    if rc is None:
        return 1
    return rc if rc >= 0 else 128 - rc


if __name__ == "__main__":
    sys.exit(main())
