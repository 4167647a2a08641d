"""A Python that has imported the frameworks, and forks a fresh process per program it is asked
to run: the suite's subprocesses skip the import (seconds of CPU each) and are otherwise new.

Keras fixes its backend when it is imported (TensorFlow's import imports it), so there is one
such Python per backend, Keras preloaded on it. A request goes to the one its program will use
(:func:`keras_backend`); a child that sets ``$KERAS_BACKEND`` to another backend exits 3.

``python preloaded.py MODULES`` imports MODULES (comma-separated, e.g. ``numpy,jax,tensorflow``),
then reads one JSON request per stdin line: ``{"argv": [...], "env": {...}, "cwd": ..., "out":
PATH, "err": PATH}``, argv as after ``python`` (``["-m", "mod", ...]`` or ``["file.py", ...]``).
It forks; the child runs the program as ``python ARGV`` would, its stdout and stderr in the two
files. Replies per request: a line with the child's pid, then one with its exit code
(``-N``: killed by signal N). Importing is not starting: no device, thread pool or backend of
TensorFlow or JAX exists before the fork, so each child still sets its own devices.
"""

from __future__ import annotations

import json
import os
import runpy
import select
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
from pathlib import Path


def _run(request: dict) -> int:
    """In the child: become ``python ARGV`` in ``cwd`` with ``env`` and return its exit code."""
    os.setpgid(0, 0)  # its own group: a timeout kills it with what it started
    null = os.open(os.devnull, os.O_RDONLY)
    out = os.open(request["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    err = os.open(request["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    for fd, target in ((null, 0), (out, 1), (err, 2)):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    if "numpy" in sys.modules:  # NumPy's global generator would be the same in every child
        sys.modules["numpy"].random.seed()
    exit_now = os._exit  # mirrorfit's CLI ends with os._exit: checked on that way out too
    os._exit = lambda code: exit_now(_same_backend(code))
    argv = request["argv"]
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            sys.path[0] = os.getcwd()
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            return _same_backend(e.code or 0)
        print(e.code, file=sys.stderr)
        return _same_backend(1)
    except KeyboardInterrupt:  # as the interpreter would: killed by SIGINT
        traceback.print_exc()
        return -signal.SIGINT
    except BaseException:  # as the interpreter would: the traceback on stderr, exit code 1
        traceback.print_exc()
        return _same_backend(1)
    return _same_backend(0)


def _same_backend(code: int) -> int:
    """``code``, or 3 where the program set ``$KERAS_BACKEND`` to another backend than the
    preloaded Keras's (in a new process it would have run there): never a silent pass."""
    keras = sys.modules.get("keras")
    wanted = os.environ.get("KERAS_BACKEND")
    if keras is None or not wanted or keras.backend.backend() == wanted:
        return code
    loaded = keras.backend.backend()
    print(
        f"preloaded.py: this program's Keras ran on {loaded}, not {wanted}: give "
        f"run_isolated keras_backend={wanted!r} (or fresh=True)",
        file=sys.stderr,
        flush=True,
    )
    return 3


def _serve() -> int | None:
    """The parent's loop: fork per request and report; in a child, return its exit code."""
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            return _run(request)
        print(pid, flush=True)
        try:
            _, status = os.waitpid(pid, 0)
        except BaseException:  # Ctrl-C or a kill of this one: not an orphan left running
            os.killpg(pid, signal.SIGKILL)
            raise
        _kill_group(pid)  # what the program left behind, as a new process's end would
        print(os.waitstatus_to_exitcode(status), flush=True)
    return None


def _kill_group(pid: int) -> None:
    """SIGKILL what is left of the process group ``pid`` (none: nothing to do)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# what each backend's interpreter imports: not starts (no device, backend or thread pool)
MODULES = {"tensorflow": ("numpy", "jax", "tensorflow"), "jax": ("numpy", "jax", "keras")}
_BLOCKS_TENSORFLOW = 'sys.modules["tensorflow"] = None'


def keras_backend(argv: list[str], env: dict[str, str]) -> str:
    """The Keras backend ``python ARGV`` will use: the last ``--backend X`` (as argparse
    reads it), else its first argument "jax" or "tensorflow", else jax for a program that
    blocks TensorFlow, else ``$KERAS_BACKEND``, else Keras's default (tensorflow)."""
    flag = None
    for arg, following in zip(argv, [*argv[1:], None]):
        if arg == "--backend" and following is not None:
            flag = following
        elif arg.startswith("--backend="):
            flag = arg.split("=", 1)[1]
    if flag is not None:
        return flag
    named = [arg for arg in argv if arg in MODULES]
    if named:
        return named[0]
    program = Path(argv[0])
    if program.suffix == ".py" and _BLOCKS_TENSORFLOW in program.read_text(encoding="utf-8"):
        return "jax"
    return env.get("KERAS_BACKEND") or "tensorflow"


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


class Preloaded:
    """The test process's side: a preloaded interpreter per Keras backend, each started on
    first use, each running one program at a time; they end when the test process does."""

    def __init__(self, import_time: tuple[str, ...]) -> None:
        self.import_time = import_time  # prefixes of the variables the imports read
        self._procs: dict[str, subprocess.Popen] = {}
        self._envs: dict[str, dict[str, str]] = {}
        self._pending = b""
        self._lock = threading.Lock()

    def run(
        self,
        argv: list[str],
        env: dict[str, str],
        cwd: Path,
        timeout: float,
        backend: str | None = None,
    ) -> subprocess.CompletedProcess | None:
        """``python ARGV`` as a fork of the interpreter for ``backend`` (default: the one
        :func:`keras_backend` names); None where it cannot be (busy, other import-time
        settings, an unknown backend), for the caller to start a new process."""
        backend = backend or keras_backend(argv, env)
        if backend not in MODULES or not self._lock.acquire(blocking=False):
            return None  # busy: a program already running, this one in parallel
        try:
            proc = self._procs.get(backend)
            if proc is None or proc.poll() is not None:
                proc = self._procs[backend] = self._start(backend, env)
            if self._differs(env, self._envs[backend]):
                return None
            return self._fork(proc, argv, env, cwd, timeout)
        finally:
            self._lock.release()

    def _start(self, backend: str, env: dict[str, str]) -> subprocess.Popen:
        self._envs[backend] = dict(env)
        return subprocess.Popen(
            [sys.executable, __file__, ",".join(MODULES[backend])],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,  # the frameworks' start-up lines
            env=dict(env, KERAS_BACKEND=backend),
            bufsize=0,
        )

    def _differs(self, env: dict[str, str], started: dict[str, str]) -> bool:
        keys = {k for k in (*env, *started) if k.startswith(self.import_time)}
        return any(env.get(k) != started.get(k) for k in keys)

    def _fork(
        self,
        proc: subprocess.Popen,
        argv: list[str],
        env: dict[str, str],
        cwd: Path,
        timeout: float,
    ) -> subprocess.CompletedProcess:
        assert proc.stdin is not None
        self._pending = b""
        with tempfile.TemporaryDirectory(prefix="mirrorfit-preloaded-") as folder:
            out, err = Path(folder, "out"), Path(folder, "err")
            request = dict(argv=argv, env=env, cwd=str(cwd), out=str(out), err=str(err))
            try:
                proc.stdin.write(json.dumps(request).encode() + b"\n")
                pid = int(self._line(proc, 120))
                code = self._exit_code(proc, pid, timeout)
            except BaseException as e:  # out of step with the interpreter: start a new one
                proc.kill()
                proc.wait()
                if isinstance(e, subprocess.TimeoutExpired):
                    raise subprocess.TimeoutExpired(argv, timeout, _read(out), _read(err)) from None
                raise
            return subprocess.CompletedProcess(argv, code, _read(out), _read(err))

    def _exit_code(self, proc: subprocess.Popen, pid: int, timeout: float) -> int:
        """The child's exit code; past ``timeout`` seconds, its group killed, TimeoutExpired."""
        try:
            return int(self._line(proc, timeout))
        except subprocess.TimeoutExpired:
            if pid > 1:
                _kill_group(pid)
            raise

    def _line(self, proc: subprocess.Popen, timeout: float | None) -> str:
        """The interpreter's next reply line, waiting at most ``timeout`` seconds."""
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        while b"\n" not in self._pending:
            if not select.select([fd], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired("preloaded", timeout or 0)
            chunk = os.read(fd, 4096)
            if not chunk:
                raise RuntimeError("the preloaded interpreter ended")
            self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        return line.decode()


if __name__ == "__main__":
    for name in filter(None, sys.argv[1].split(",")):
        __import__(name)
    code = _serve()
    if code is not None and code < 0:  # KeyboardInterrupt: killed by SIGINT, as Python ends
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    if code is not None:  # a child ends as the program would: atexit handlers, threads joined
        sys.exit(code)
