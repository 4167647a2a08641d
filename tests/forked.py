"""The asking side of tests/forkserver.py: ``subprocess.Popen`` patched so that a Python program
is forked from a preloaded server where that is sound, else started as a new process.

The Popen object is the usual one (pipes, ``communicate``, ``send_signal``, ``kill``) with the
child's real pid; only its wait status comes from the server, which is the child's parent."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading

from forkserver import MODULES, OFF, SOCKETS, server_for

_ORIGINAL: dict = {}  # Popen's own methods, by name
_servers: dict[str, subprocess.Popen | None] = {}  # this process's (None: failed to start)
_starting = threading.Lock()
_owner = False  # True in the process that starts the servers
_LOST = 255 << 8  # wait status where the server ended first: exit code 255


def install(start_servers: bool = False) -> None:
    """Patch ``subprocess.Popen`` in this process (once). ``start_servers``: this process
    starts each server on first use, and they end when it does (the test process)."""
    global _owner
    _owner = _owner or start_servers
    if _ORIGINAL:
        return
    for name, patched in (
        ("_execute_child", _execute_child),
        ("_try_wait", _try_wait),
        ("_internal_poll", _internal_poll),
    ):
        _ORIGINAL[name] = getattr(subprocess.Popen, name)
        setattr(subprocess.Popen, name, patched)


def _execute_child(
    self, args, executable, preexec_fn, close_fds, pass_fds, cwd, env, startupinfo,
    creationflags, shell, p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite,
    restore_signals, gid, gids, uid, umask, start_new_session, process_group,
):  # fmt: skip
    plain = not (shell or executable or preexec_fn or pass_fds or gids) and umask < 0 and close_fds
    plain = plain and gid is None and uid is None and process_group == -1
    conn, argv = None, []
    if plain and isinstance(args, (list, tuple)):
        argv = [os.fspath(a) if isinstance(a, os.PathLike) else a for a in args]
    if argv and all(isinstance(a, str) for a in argv):
        streams = (p2cread, c2pwrite, errwrite)
        conn = _ask(self, argv, cwd, env, start_new_session, streams)
    if conn is None:
        return _ORIGINAL["_execute_child"](
            self, args, executable, preexec_fn, close_fds, pass_fds, cwd, env, startupinfo,
            creationflags, shell, p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite,
            restore_signals, gid, gids, uid, umask, start_new_session, process_group,
        )  # fmt: skip
    self._fork_conn, self._fork_reply = conn, b""
    self._child_created = True
    self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)


def _ask(popen, args, cwd, env, session: bool, streams) -> socket.socket | None:
    """Ask the right server to fork ``args``; the connection its wait status will come on,
    with ``popen.pid`` set, or None where a new process must run it."""
    if len(args) < 2 or os.path.abspath(args[0]) != sys.executable:
        return None
    cwd = os.path.abspath(os.fsdecode(cwd)) if cwd is not None else os.getcwd()
    env = dict(os.environ if env is None else env)
    if not os.path.isdir(cwd) or not all(isinstance(v, str) for v in (*env, *env.values())):
        return None
    backend, folder = server_for(args[1:], env, cwd), os.environ.get(SOCKETS)
    if backend not in MODULES or not folder:
        _log(args, f"no server: backend {backend}, folder {folder}")
        return None
    path = os.path.join(folder, f"{backend}.sock")
    if _owner:
        _start(backend, path)
    request = dict(
        argv=args[1:],
        env=env,
        cwd=cwd,
        session=bool(session),
        pgid=os.getpgid(0),
        sid=os.getsid(0),
        cpus=sorted(os.sched_getaffinity(0)),
        umask=_umask(),
        ignored=_ignored_signals(),
    )
    body = json.dumps(request).encode()
    fds = [fd if fd != -1 else default for fd, default in zip(streams, (0, 1, 2))]
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.settimeout(120)
        conn.connect(path)
        socket.send_fds(conn, [b"%16d" % len(body)], fds)
        conn.sendall(body)
        reply = _line(conn)
    except OSError as e:
        _log(args, f"{path}: {e}")
        conn.close()
        return None
    if not reply.startswith("pid "):  # refused: another environment, session, ...
        _log(args, reply)
        conn.close()
        return None
    conn.settimeout(None)
    popen.pid = int(reply[4:])
    return conn


def _log(args: list[str], why: str) -> None:
    """Why ``args`` starts a new process, to the file $MIRRORFIT_TESTS_FORK_LOG names (if)."""
    if os.environ.get("MIRRORFIT_TESTS_FORK_LOG"):
        with open(os.environ["MIRRORFIT_TESTS_FORK_LOG"], "a", encoding="utf-8") as f:
            f.write(f"{os.getpid()} {' '.join(args)[:160]!r}: {why}\n")


def _line(conn: socket.socket) -> str:
    """One reply line, read a byte at a time (the status line may follow at once)."""
    line = b""
    while not line.endswith(b"\n"):
        byte = conn.recv(1)
        if not byte:
            raise ConnectionError("the server closed the connection")
        line += byte
    return line.decode().strip()


def _ignored_signals() -> list[int]:
    """The signals this process ignores (a child inherits that across exec), but SIGPIPE and
    SIGXFSZ, which Python ignores in every process anyway."""
    out = []
    for number in set(signal.valid_signals()) - {signal.SIGPIPE, signal.SIGXFSZ}:
        try:
            if signal.getsignal(number) == signal.SIG_IGN:
                out.append(int(number))
        except (ValueError, OSError):
            pass
    return sorted(out)


def _umask() -> int:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            return int(next(ln for ln in f if ln.startswith("Umask:")).split()[1], 8)
    except (OSError, StopIteration, ValueError):
        mask = os.umask(0o22)
        os.umask(mask)
        return mask


def _status(popen, block: bool) -> int | None:
    """The child's wait status from its server; None where not ended yet (``block`` False)."""
    conn = popen._fork_conn
    while b"\n" not in popen._fork_reply:
        if not block and not select.select([conn], [], [], 0)[0]:
            return None
        chunk = conn.recv(64)
        if not chunk:  # the server ended before the child: no status to read
            print(f"forked.py: no exit status for pid {popen.pid}", file=sys.stderr)
            popen._fork_reply = b"%d\n" % _LOST
        popen._fork_reply += chunk
    conn.close()
    return int(popen._fork_reply.split(b"\n")[0])


def _try_wait(self, wait_flags):
    if getattr(self, "_fork_conn", None) is None:
        return _ORIGINAL["_try_wait"](self, wait_flags)
    status = _status(self, block=not wait_flags & os.WNOHANG)
    return (0, 0) if status is None else (self.pid, status)


def _internal_poll(self, _deadstate=None, *args, **kwargs):
    if getattr(self, "_fork_conn", None) is None:
        return _ORIGINAL["_internal_poll"](self, _deadstate, *args, **kwargs)
    if self.returncode is None and self._waitpid_lock.acquire(False):
        try:
            if self.returncode is None:
                status = _status(self, block=False)
                if status is not None:
                    self._handle_exitstatus(status)
        except OSError:
            if _deadstate is not None:
                self.returncode = _deadstate
        finally:
            self._waitpid_lock.release()
    return self.returncode


def _start(backend: str, path: str) -> None:
    """Start this backend's server unless it runs; wait until it listens."""
    with _starting:
        if backend in _servers and (_servers[backend] is None or _servers[backend].poll() is None):
            return  # running, or failed to start once: new processes then
        if os.path.exists(path):
            os.unlink(path)
        server = os.path.join(os.path.dirname(os.path.abspath(__file__)), "forkserver.py")
        proc = subprocess.Popen(
            [sys.executable, server, backend, path],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,  # the frameworks' start-up lines
            env=dict(os.environ, KERAS_BACKEND=backend, **{OFF: "0"}),  # itself a new process
        )
        assert proc.stdout is not None
        if select.select([proc.stdout], [], [], 300)[0] and proc.stdout.readline() == b"ready\n":
            _servers[backend] = proc
        else:  # none: each program starts a new process
            proc.kill()
            proc.wait()
            _servers[backend] = None
