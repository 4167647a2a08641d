"""Python processes for the suite, forked from a Python that has imported the frameworks: a
program the tests (or a program under test, such as ``mirrorfit launch``) start as
``python -m MODULE ...``, ``python FILE.py ...`` or ``python -c CODE ...`` skips the imports
(seconds of CPU each) and is otherwise a new process: its own pid, argv, environment, folder,
streams, process group or session, CPU affinity and exit status.

Keras fixes its backend when it is imported, so there is one server per backend, Keras
preloaded on it (:data:`MODULES`); a program goes to the one it will use
(:func:`keras_backend`), and a child whose Keras runs on another backend exits 3. The test
process starts the servers on first use; they end when it does.

How: :func:`install` patches ``subprocess.Popen`` (in the test process and in every forked
child) so that a Python program is asked of a server over a Unix socket, the child's three
standard streams passed along (SCM_RIGHTS). The server forks, replies the child's pid, and
later its wait status, which ``Popen.wait``/``poll`` read. Anything else (other programs,
interpreter options, ``preexec_fn``, ``pass_fds``, other users, another session, another
import-time environment, ``MIRRORFIT_TESTS_PRELOAD=0``) starts a new process as before.
Importing is not starting: no device, runtime or backend of TensorFlow or JAX exists before
the fork (only the few idle threads the imports start, which a child does not inherit), so
each child still sets its own devices.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import json
import os
import runpy
import select
import signal
import socket
import sys
import threading
import traceback
from pathlib import Path

MODULES = {"tensorflow": ("numpy", "jax", "tensorflow"), "jax": ("numpy", "jax", "keras")}
# Prefixes of the variables the preloaded imports read: a request that differs gets a new
# process. (PYTHONPATH and PYTHONUNBUFFERED are applied in the child instead.)
IMPORT_TIME = (
    *("JAX_", "TF_", "XLA_", "CUDA_", "OMP_", "OPENBLAS_", "MKL_", "PYTHON"),
    *("KERAS_", "HOME", "LANG", "LC_", "LD_", "MALLOC_", "GLIBC_TUNABLES"),
)
_APPLIED_IN_CHILD = ("PYTHONPATH", "PYTHONUNBUFFERED")
# match a prefix, but read later: when a cluster is resolved, when CUDA starts (not on import)
# (KERAS_BACKEND picks the server, and a child that changes it exits 3)
_READ_LATER = ("TF_CONFIG", "CUDA_VISIBLE_DEVICES", "KERAS_BACKEND")
SOCKETS = "MIRRORFIT_TESTS_FORKSERVERS"  # the folder of the servers' sockets, <backend>.sock
OFF = "MIRRORFIT_TESTS_PRELOAD"  # "0": new processes only
BACKEND = "MIRRORFIT_TESTS_KERAS_BACKEND"  # the backend a program runs on, where argv can't tell
_BLOCKS_TENSORFLOW = 'sys.modules["tensorflow"] = None'
_BLOCKED_CLI = "blocked_cli_driver.py"
_EXIT = os._exit  # a child's own is wrapped to check its backend on that way out


def keras_backend(argv: list[str], env: dict[str, str]) -> str:
    """The Keras backend ``python ARGV`` will use: $MIRRORFIT_TESTS_KERAS_BACKEND, else the
    last ``--backend X`` (as argparse reads it), else its first argument "jax" or
    "tensorflow", else the one that wrote the checkpoints ``evaluate --checkpoint-dir`` scores,
    else jax for a program that blocks TensorFlow, else ``$KERAS_BACKEND``,
    else Keras's default (tensorflow)."""
    if env.get(BACKEND):
        return env[BACKEND]
    flag = None
    for arg, following in zip(argv, [*argv[1:], None]):
        if arg == "--backend" and following is not None:
            flag = following
        elif arg.startswith("--backend="):
            flag = arg.split("=", 1)[1]
    if flag is not None:
        return flag
    if "evaluate" in argv and "--checkpoint-dir" in argv[:-1]:  # the one that wrote it
        from mirrorfit.artifacts.epoch_checkpoint import recorded_backend

        folder = Path(argv[argv.index("--checkpoint-dir") + 1])
        with contextlib.suppress(OSError):
            return recorded_backend(folder) or "tensorflow"
    for arg in argv:  # a bench point: python -m mirrorfit.bench.point '{"backend": ...}'
        if arg.startswith("{") and '"backend"' in arg:
            try:
                return json.loads(arg)["backend"]
            except (ValueError, TypeError, KeyError):
                pass
    named = [arg for arg in argv if arg in MODULES]
    if named:
        return named[0]
    program = Path(argv[0] if argv else "")
    if program.suffix == ".py" and _BLOCKS_TENSORFLOW in program.read_text(encoding="utf-8"):
        return "jax"
    return env.get("KERAS_BACKEND") or "tensorflow"


def server_for(argv: list[str], env: dict[str, str], cwd: str) -> str | None:
    """The backend whose server may run ``python ARGV`` (argv after ``python``), or None."""
    if env.get(OFF) == "0" or not argv or argv[0] not in ("-m", "-c") and argv[0][:1] == "-":
        return None
    if argv[0] in ("-m", "-c"):
        return keras_backend(argv[2:], env) if len(argv) > 1 else None
    program = Path(cwd, argv[0])
    if not program.is_file():
        return None  # python's own message for a missing file
    if program.name != _BLOCKED_CLI or len(argv) < 2:
        return keras_backend([str(program), *argv[1:]], env)
    # mirrorfit's CLI where importing these modules fails: sound on JAX's server for
    # tensorflow alone (it has not imported it), else in a new process only
    backend = keras_backend(argv[2:], env)
    return backend if argv[1] == "tensorflow" and backend == "jax" else None


# ---- the server ------------------------------------------------------------------------


def serve(backend: str, path: str) -> tuple[int, bool] | None:
    """Import the backend's modules, listen on ``path`` and fork a child per request until
    stdin ends; return None there, or in a child what :func:`_run` returns."""
    from forked import install

    started = dict(os.environ)  # before the imports: Keras's sets a variable
    for name in MODULES[backend]:
        __import__(name)
    gc.freeze()  # what is imported stays out of the children's collections (and unwritten)
    install()  # a child's own Python programs are forked too
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    entries = started.get("PYTHONPATH", "").split(os.pathsep) if started.get("PYTHONPATH") else []
    started_tail = sys.path[1 + len(entries) :]  # sys.path past PYTHONPATH's entries
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    print("ready", flush=True)
    children: dict[int, socket.socket] = {}
    while True:
        ready = select.select([0, wake_r, listener], [], [])[0]
        if 0 in ready and not os.read(0, 4096):
            return None  # the test process ended
        if wake_r in ready:
            os.read(wake_r, 4096)
            _reap(children)
        if listener in ready:
            conn = listener.accept()[0]
            child = _accept(conn, started, children)
            if child is not None:  # in the forked child: leave the server's loop
                os.close(wake_r)
                os.close(wake_w)
                listener.close()  # the object's: a bare os.close would close a reused fd later
                return _run(*child, started_tail)


def _reap(children: dict[int, socket.socket]) -> None:
    """Send each ended child's wait status to the socket that asked for it."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is not None:
            try:
                conn.sendall(f"{status}\n".encode())
            except OSError:
                pass  # the asker has gone: nobody waits for this status
            conn.close()


def _accept(conn: socket.socket, started: dict, children: dict) -> tuple | None:
    """Read one request and fork for it; in the child, return (request, fds)."""
    fds: list[int] = []
    try:
        conn.settimeout(30)
        request, fds = _receive(conn)
        why = _refusal(request, started)
        if why:
            conn.sendall(f"refuse {why}\n".encode())
            raise ValueError(why)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
    except (OSError, ValueError):
        for fd in fds:
            os.close(fd)
        conn.close()
        return None
    if pid == 0:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for other in [conn, *children.values()]:
            other.close()
        return request, fds
    for fd in fds:
        os.close(fd)
    children[pid] = conn
    try:
        conn.sendall(f"pid {pid}\n".encode())
    except OSError:
        pass
    return None


def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    """A request: its length in 16 bytes with the three stream fds, then its JSON."""
    head, fds, _, _ = socket.recv_fds(conn, 16, 3)
    body = _exactly(conn, int(_exactly(conn, 16, head)))
    if len(fds) != 3:
        for fd in fds:
            os.close(fd)
        raise ValueError("three streams expected")
    return json.loads(body), fds


def _exactly(conn: socket.socket, size: int, start: bytes = b"") -> bytes:
    """``size`` bytes from ``conn``, ``start`` the first of them."""
    data = start
    while len(data) < size:
        more = conn.recv(size - len(data))
        if not more:
            raise ValueError("short request")
        data += more
    return data


def _refusal(request: dict, started: dict) -> str:
    """Why this server cannot run the request ("" where it can)."""
    env = request["env"]
    keys = {k for k in (*env, *started) if k.startswith(IMPORT_TIME)}
    keys -= {*_APPLIED_IN_CHILD, *_READ_LATER}
    differs = sorted(k for k in keys if env.get(k) != started.get(k))
    if differs:
        return "import-time settings differ: " + ",".join(differs)
    if not request["session"] and request["sid"] != os.getsid(0):
        return "another session"
    argv, cwd = request["argv"], request["cwd"]
    path0 = cwd if argv[0] in ("-m", "-c") else os.path.dirname(os.path.join(cwd, argv[0]))
    path = os.pathsep.join([path0, env["PYTHONPATH"]]) if env.get("PYTHONPATH") else path0
    shadowed = _shadowed(path, started.get("PYTHONPATH", ""), cwd)
    if shadowed:
        return "its folder or PYTHONPATH has its own " + ",".join(shadowed)
    return ""


def _shadowed(path: str, started: str, cwd: str) -> list[str]:
    """The modules imported here that a folder on ``path`` (from ``cwd``: the program's own
    folder, then its PYTHONPATH) but not on ``started`` (the server's PYTHONPATH) would have
    given a new process instead (a stand-in tensorflow)."""
    loaded = {name.partition(".")[0] for name in sys.modules} - {"forked", "forkserver"}
    before = {os.path.abspath(p) for p in started.split(os.pathsep) if p}
    folders = {os.path.abspath(os.path.join(cwd, p)) for p in path.split(os.pathsep)} - before
    found = set()
    for folder in folders:
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        found |= {n.removesuffix(".py") for n in names} & loaded
    return sorted(found)


def _run(request: dict, fds: list[int], path_tail: list[str]) -> tuple[int, bool]:
    """In the child: become ``python ARGV`` as the request says; return its exit code and
    whether it ended on Ctrl-C (KeyboardInterrupt)."""
    if request["session"]:
        os.setsid()
    else:
        os.setpgid(0, request["pgid"])  # the asker's group, as a child of the asker would be
    for fd, target in zip(fds, (0, 1, 2)):
        if fd != target:
            os.dup2(fd, target)
    for fd in set(fds) - {0, 1, 2}:
        os.close(fd)
    for number in request["ignored"]:  # dispositions that survive exec; handlers do not
        signal.signal(number, signal.SIG_IGN)
    os.sched_setaffinity(0, request["cpus"])
    os.umask(request["umask"])
    os.chdir(request["cwd"])
    env = request["env"]
    os.environ.clear()
    os.environ.update(env)
    _python_settings(env, path_tail)
    if "tempfile" in sys.modules:  # TensorFlow's import fixed it from the server's TMPDIR
        sys.modules["tempfile"].tempdir = None
    if "numpy" in sys.modules:  # NumPy's global generator would be the same in every child
        sys.modules["numpy"].random.seed()
    exit_now = os._exit  # mirrorfit's CLI ends with os._exit: checked on that way out too
    os._exit = lambda code: exit_now(_same_backend(code))
    code, interrupted = _main(request["argv"])
    return _same_backend(code), interrupted


def _python_settings(env: dict[str, str], path_tail: list[str]) -> None:
    """What a new interpreter would take from PYTHONPATH (``path_tail``: sys.path past its
    entries) and PYTHONUNBUFFERED, and its streams' buffering for what they now are."""
    entries = env["PYTHONPATH"].split(os.pathsep) if env.get("PYTHONPATH") else []
    sys.path[1:] = [*(os.path.abspath(p) if p else os.getcwd() for p in entries), *path_tail]
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    sys.stdout.reconfigure(line_buffering=os.isatty(1), write_through=unbuffered)
    sys.stderr.reconfigure(write_through=unbuffered)


def _main(argv: list[str]) -> tuple[int, bool]:
    """Run ``python ARGV`` in this process; its exit code, and whether Ctrl-C ended it."""
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            sys.path[0] = os.getcwd()
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        elif argv[0] == "-c":
            sys.argv = ["-c", *argv[2:]]
            sys.path[0] = ""
            exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})
        else:
            sys.argv = list(argv)
            sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            return e.code or 0, False
        print(e.code, file=sys.stderr)
        return 1, False
    except KeyboardInterrupt:  # as the interpreter would: killed by SIGINT
        traceback.print_exc()
        return 1, True
    except BaseException:  # as the interpreter would: the traceback on stderr, exit code 1
        traceback.print_exc()
        return 1, False
    return 0, False


def _same_backend(code: int) -> int:
    """``code``, or 3 where the program set ``$KERAS_BACKEND`` to another backend than the
    preloaded Keras's (in a new process it would have run there): never a silent pass."""
    keras = sys.modules.get("keras")
    wanted = os.environ.get("KERAS_BACKEND")
    if keras is None or not wanted or keras.backend.backend() == wanted:
        return code
    loaded = keras.backend.backend()
    print(
        f"forkserver.py: this program's Keras ran on {loaded}, not {wanted}: set "
        f"{BACKEND}={wanted} in its environment (or {OFF}=0 for a new process)",
        file=sys.stderr,
        flush=True,
    )
    return 3


def _end(code: int, interrupted: bool) -> None:
    """End a child as Python ends a program: killed by SIGINT after Ctrl-C, else ``code``.
    Where the program started TensorFlow's or JAX's runtime, with the interpreter's whole
    teardown, as a new process would. Else without the teardown of the preloaded modules
    (about a second of CPU per child for TensorFlow, that a new process running a light program
    never pays): its threads joined, atexit handlers run, its objects collected (an unclosed
    file flushed), streams flushed."""
    if not interrupted and _runtime_started():
        sys.exit(code)
    getattr(threading, "_shutdown", lambda: None)()
    atexit._run_exitfuncs()
    gc.collect()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    _EXIT(code & 0xFF)


def _runtime_started() -> bool:
    """Whether this process started TensorFlow's eager runtime or a JAX backend (True where
    it cannot tell)."""
    context = sys.modules.get("tensorflow.python.eager.context")
    if context is not None:
        current = getattr(context, "context_safe", lambda: True)()
        if current is not None and getattr(current, "_initialized", True):
            return True
    bridge = sys.modules.get("jax._src.xla_bridge")
    return bridge is not None and bool(getattr(bridge, "_backends", True))


if __name__ == "__main__":
    child = serve(sys.argv[1], sys.argv[2])
    if child is not None:
        _end(*child)
