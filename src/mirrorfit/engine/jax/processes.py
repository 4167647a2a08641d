"""A JAX run over several processes (``--strategy multi-worker --backend jax``): joining the
job on JAX's own runtime, and ending it in one line when another process goes.

- :func:`join`: ``jax.distributed.initialize`` for a
  :class:`~mirrorfit.distribute.cluster.Cluster`, before JAX starts its backends;
- a watchdog thread: a task that never joins, or a call that waits too long;
- :func:`peer_failure`: a collective that failed because a task died;
- :func:`_name_a_lost_chief`: the chief's death (a SIGABRT) in one line.

(why: docs/multi-worker-jax.md#when-something-goes-wrong,
docs/architecture.md#jax-multi-process)
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import sys
import threading
import time
from typing import Iterator

from mirrorfit.distribute.cluster import DEFAULT_COLLECTIVE_TIMEOUT_S
from mirrorfit.errors import ClusterError, ConfigError

EXIT_PEER_FAILED = ClusterError.exit_code  # 69: sysexits' EX_UNAVAILABLE, as on TensorFlow
# Seconds JAX's own deadlines (its start-up wait, its heartbeat) run past mirrorfit's, so that
# mirrorfit's one line comes first, not JAX's fatal abort.
_JAX_MARGIN_S = 60


class _Joined:
    """This process's place in a joined job (one per process)."""

    def __init__(self, cluster, timeout_s: float, watchdog: "_Watchdog", beacon) -> None:
        self.cluster, self.timeout_s, self.watchdog = cluster, timeout_s, watchdog
        self.beacon = beacon  # kept open for the process's life


_joined: _Joined | None = None


def joined():
    """The cluster this process joined, or None."""
    return _joined.cluster if _joined is not None else None


def join(cluster, *, timeout_s: float = DEFAULT_COLLECTIVE_TIMEOUT_S) -> None:
    """Join ``cluster``'s job through ``jax.distributed`` (once per process, before JAX starts
    its backends). ConfigError, one line, for a cluster the JAX engine cannot train on or a
    port another process holds; a task that has not joined after ``timeout_s`` seconds ends
    this process with one line naming it (exit 69)."""
    global _joined
    if _joined is not None:
        if _joined.cluster != cluster:
            raise ConfigError(
                "this process already joined another cluster; one process belongs to one job"
            )
        return
    if cluster.ps or cluster.task_type not in ("worker", "chief"):
        raise ConfigError(
            f"--strategy multi-worker: this cluster has parameter servers (task "
            f"{cluster.task_name()}); the JAX engine trains on workers only: a "
            "cluster of workers, or --backend tensorflow"
        )
    from mirrorfit.distribute import _listen

    ip, note = _listen.prepare(cluster)  # this task's port in use: one line, at once
    me = cluster.address(cluster.task_type, cluster.task_index)
    port = int(me.rpartition(":")[2])
    if note and cluster.is_chief:
        print(
            f"mirrorfit: {cluster.task_name()}: JAX's coordination service listens on every "
            f"interface ({note}); keep the job on a private network",
            file=sys.stderr,
        )
    import jax

    from jax._src import xla_bridge

    if xla_bridge.backends_are_initialized():
        raise ConfigError(
            "--strategy multi-worker: JAX already started on this process; join "
            "the cluster first (configure_devices(cluster=...) before any JAX "
            "computation), or run in a fresh process"
        )
    # JAX's preemption service installs a C++ SIGTERM handler; mirrorfit's own (every worker
    # agrees on the step, saves, exits 75) must keep the signal.
    jax.config.update("jax_enable_preemption_service", False)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    _gloo_on(ip)
    # Without an address of its own here (NAT), a task keeps no port: it is then not named.
    beacon = None if cluster.is_chief or not ip else _Beacon(ip, port)
    watchdog = _Watchdog(cluster, timeout_s)
    bind = f"{_host(ip) if ip else '[::]'}:{port}"
    text = (
        f"did not join within {timeout_s:g} s; check that every task started (its log), "
        "or raise --collective-timeout"
    )
    with watchdog.waiting(text):
        jax.distributed.initialize(
            coordinator_address=_chief_address(cluster),
            num_processes=cluster.num_workers,
            process_id=cluster.worker_rank,
            coordinator_bind_address=bind,
            initialization_timeout=int(timeout_s) + _JAX_MARGIN_S,
            heartbeat_timeout_seconds=int(timeout_s) + _JAX_MARGIN_S,
        )
    _joined = _Joined(cluster, timeout_s, watchdog, beacon)
    if not cluster.is_chief:
        _name_a_lost_chief(cluster)


def _host(ip: str) -> str:
    return f"[{ip}]" if ":" in ip else ip


def _chief_address(cluster) -> str:
    """The coordinator: the chief task's address (a ``chief`` job's, else ``worker 0``'s)."""
    return cluster.chief if cluster.chief is not None else cluster.workers[0]


def _gloo_on(ip: str | None) -> None:
    """Have the CPU client's gloo collectives listen on ``ip``, this task's own address from the
    cluster spec (the one the other tasks reach it at). JAX makes them with the address of the
    host's name and has no setting for it; its CPU backend factory is registered again, the
    same as JAX's but for that argument. Where JAX's internals differ (another version), its
    own factory stays."""
    if not ip:
        return
    try:
        from jax._src import distributed, xla_bridge
        from jax._src.lib import _jax

        make_collectives = _jax.make_gloo_tcp_collectives
        make_client = xla_bridge.make_cpu_client

        def cpu_client():
            collectives = make_collectives(
                distributed_client=distributed.global_state.client, hostname=ip
            )
            return make_client(collectives=collectives)

        xla_bridge.register_backend_factory("cpu", cpu_client, priority=0, fail_quietly=False)
    except (ImportError, AttributeError, TypeError):  # pragma: no cover (another JAX)
        pass


# Seconds a dead task's port may still accept connections (docs/multi-worker-jax.md).
_SETTLE_S = 2.0
_report = threading.Lock()


def claim_report() -> bool:
    """Whether the caller is the first in this process to say why it ends (a failed
    collective, the watchdog, the SIGABRT handler): one line, from one of them."""
    return _report.acquire(blocking=False)


def gone(cluster) -> list[str]:
    """The tasks whose port refuses connections, waiting up to ``_SETTLE_S`` for a dead one's
    port to close (it outlives the process by tens of ms)."""
    deadline = time.monotonic() + _SETTLE_S
    while True:
        found = cluster.unreachable(timeout_s=1.0)
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


_ABORT_HANDLER = ctypes.CFUNCTYPE(None, ctypes.c_int)
_kept: list = []  # the handler, alive for the process's life


def _name_a_lost_chief(cluster) -> None:
    """On a task that is not the chief: when the chief dies and JAX aborts this process (SIGABRT),
    say so in one line and exit 69 if the chief's port refuses connections; any other abort goes
    on. (why: docs/multi-worker-jax.md#when-something-goes-wrong)
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:  # pragma: no cover
        return
    address = _chief_address(cluster)
    name = "chief" if cluster.chief is not None else "worker 0"
    host, _, port = address.rpartition(":")
    line = (
        f"mirrorfit: error: {cluster.task_name()}: {name} ({address}) stopped answering "
        "(JAX's coordination service, which it runs, is gone); restart the group to "
        "resume from the last checkpoint (`mirrorfit launch --max-restarts N` does)\n"
    ).encode()

    def on_abort(signum: int) -> None:
        try:
            # A killed process's port closes shortly after it died (its memory is released
            # first): a refusal within a second or two is the chief gone.
            deadline = time.monotonic() + _SETTLE_S
            while True:
                try:
                    socket.create_connection((host.strip("[]"), int(port)), timeout=1).close()
                except OSError:
                    break
                if time.monotonic() > deadline:
                    return  # the chief answers: not this case; abort() goes on
                time.sleep(0.05)
            if claim_report():
                os.write(2, line)
            else:  # the main thread is saying it (a failed all-reduce): let it finish
                time.sleep(_SETTLE_S * 5)
            os._exit(EXIT_PEER_FAILED)
        except BaseException:  # pragma: no cover (a handler must not raise)
            pass

    handler = _ABORT_HANDLER(on_abort)
    _kept.append(handler)
    libc.signal.restype = ctypes.c_void_p
    libc.signal.argtypes = (ctypes.c_int, ctypes.c_void_p)
    libc.signal(signal.SIGABRT, ctypes.cast(handler, ctypes.c_void_p))


class _Beacon:
    """A listening socket on this task's own address and port, for as long as the process
    lives: the others tell by it that this task is still there (they connect, it closes)."""

    def __init__(self, ip: str, port: int) -> None:
        family = socket.AF_INET6 if ":" in ip else socket.AF_INET
        self.socket = socket.create_server((ip, port), family=family, backlog=64)
        threading.Thread(target=self._serve, name="mirrorfit-beacon", daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.socket.accept()
            except OSError:
                return
            conn.close()


class _Watchdog:
    """Ends this process, with one line naming the tasks that are gone, when a wait for the
    others (:meth:`waiting`) lasts longer than ``timeout_s``. A thread: JAX releases the GIL
    while it waits for its peers (its start-up, a collective)."""

    def __init__(self, cluster, timeout_s: float) -> None:
        self.cluster, self.timeout_s = cluster, timeout_s
        self._since: float | None = None
        self._text = ""
        self._depth = 0
        threading.Thread(target=self._run, name="mirrorfit-peers", daemon=True).start()

    @contextlib.contextmanager
    def waiting(self, text: str) -> Iterator[None]:
        """A block that waits for the other tasks; ``text`` ends the line if it lasts too
        long. Nested blocks count from the outermost."""
        if self._depth == 0:
            self._text, self._since = text, time.monotonic()
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                self._since = None

    def _run(self) -> None:
        while True:
            time.sleep(min(0.25, self.timeout_s / 4))
            since = self._since
            if since is None or time.monotonic() - since < self.timeout_s:
                continue
            who = ", ".join(gone(self.cluster)) or "another worker"
            if claim_report():
                os.write(
                    2,
                    f"mirrorfit: error: {self.cluster.task_name()}: {who} {self._text}\n".encode(),
                )
            else:  # another part of this process is saying why it ends
                time.sleep(_SETTLE_S * 5)
            os._exit(EXIT_PEER_FAILED)


def waiting(text: str | None = None):
    """A context for a call that waits for the other tasks (a compiled step's all-reduce, a
    metric read): past ``--collective-timeout`` the watchdog ends this process in one line.
    Nothing on one process."""
    if _joined is None:
        return contextlib.nullcontext()
    t = _joined.timeout_s
    return _joined.watchdog.waiting(
        text
        or (
            f"stopped answering: a collective waited {t:g} s (--collective-timeout); restart the "
            "group to resume from the last checkpoint (`mirrorfit launch --max-restarts N` does)"
        )
    )


@contextlib.contextmanager
def gloo_lines_dropped() -> Iterator[None]:
    """Run the block with file descriptor 1 in a temporary file, then write back all but
    gloo's "[Gloo] Rank 0 is connected to 1 peer ranks..." lines: gloo prints one, to stdout,
    when a process first meets the others in a collective (the block)."""
    from mirrorfit._frameworks import filtered

    with filtered(1, lambda line: line.startswith("[Gloo]")):
        yield


# What gloo and JAX's runtime say when a peer's connection went away mid-collective (seen:
# "UNKNOWN: Gloo all-reduce failed: [...pair.cc:547] Connection closed by peer [127.0.0.1]:N").
_GONE = ("Gloo", "Connection reset", "Connection closed", "Connection refused", "Broken pipe")
_GONE_STATUS = ("UNAVAILABLE", "DEADLINE_EXCEEDED", "ABORTED", "CANCELLED")


def peer_failure(error: BaseException) -> bool:
    """Whether ``error`` is a JAX collective or runtime call that failed because another task of a
    joined job went away: a JaxRuntimeError from the call, or the ValueError that reading its
    result raises (e.g. ``np.asarray`` of a failed all-reduce's output: "ValueError: UNKNOWN:
    Gloo all-reduce failed: ... Connection reset by peer").
    """
    if _joined is None:
        return False
    jax = sys.modules.get("jax")
    if jax is None:
        return False
    text = str(error)
    if isinstance(error, jax.errors.JaxRuntimeError):
        return any(s in text for s in _GONE) or text.startswith(_GONE_STATUS)
    return (
        isinstance(error, ValueError)
        and text.startswith(("UNKNOWN: ", *_GONE_STATUS))
        and any(s in text for s in _GONE)
    )


__all__ = [
    "join",
    "joined",
    "waiting",
    "peer_failure",
    "gloo_lines_dropped",
    "claim_report",
    "gone",
    "EXIT_PEER_FAILED",
]
