"""Shared fixtures: the real MNIST file and a runner for code that needs a fresh TensorFlow.

Logical CPU devices must be set before TensorFlow initialises, so anything that uses several
replicas runs in its own interpreter (``run_isolated``): a program in a file beside its test,
``*_driver.py`` (ruff reads it, pytest does not collect it), which takes its parameters as
arguments and prints one JSON line at the end.

Every Python program the suite starts (and those they start) is forked from a preloaded
interpreter where that is sound (tests/forkserver.py); ``MIRRORFIT_TESTS_PRELOAD=0`` in a
program's environment, or ``fresh=True`` here, starts a new interpreter instead.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import forked
import pytest
from forkserver import OFF, SOCKETS

# On a GPU host, TensorFlow would reserve all of a GPU's memory in the first process that touches
# it; the suite runs two test processes (pytest-xdist) and their subprocesses side by side.
# (It also overrides --no-memory-growth in the suite's runs: no test checks that setting on a GPU.)
os.environ.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")
# TensorFlow's C++ start-up lines off in the suite's processes (read when TensorFlow loads:
# the same value for the preloaded interpreters and the programs forked from them)
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"


def _share_jax_compilations() -> None:
    """One JAX compilation cache per test process for the processes it starts (in a folder
    that pytest's first process makes and removes at exit): the suite compiles the same small
    steps in hundreds of processes. The executables are XLA's own, reloaded, so results are
    unchanged. Set JAX_COMPILATION_CACHE_DIR to keep one across runs instead."""
    base = os.environ.get("MIRRORFIT_TESTS_JAX_CACHE")
    if base is None:
        if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
            return
        import atexit
        import shutil

        base = os.environ["MIRRORFIT_TESTS_JAX_CACHE"] = tempfile.mkdtemp(
            prefix="mirrorfit-tests-jax-cache-"
        )
        atexit.register(shutil.rmtree, base, ignore_errors=True)
        os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.1")
        os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
    # Per test process: JAX writes an entry in place, and another test process's reader could
    # see it half written (a warning on stderr, where tests read one line).
    folder = os.path.join(base, os.environ.get("PYTEST_XDIST_WORKER", "main"))
    os.makedirs(folder, exist_ok=True)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = folder


_share_jax_compilations()

ROOT = Path(__file__).resolve().parents[1]
# ``python blocked_cli_driver.py MODULES ARGS``: mirrorfit's CLI where importing MODULES fails.
BLOCKED_CLI = ROOT / "tests" / "blocked_cli_driver.py"


def _find_mnist() -> tuple[Path | None, str]:
    """(the folder holding mnist.npz, "") found by the program's own rules, or (None, why not):
    ``$MIRRORFIT_DATA``, then ``../shared/data`` beside the clone (CI's folder) where it exists,
    then the Keras cache, then the download (mirrorfit.data.mnist.locate_mnist). So the README's
    test command passes on a fresh machine once its first command has put MNIST in the cache."""
    from mirrorfit.data.mnist import locate_mnist
    from mirrorfit.errors import DataError

    shared = ROOT.parent / "shared" / "data"
    if not os.environ.get("MIRRORFIT_DATA") and (shared / "mnist.npz").is_file():
        return shared, ""
    try:
        file = locate_mnist(download=True)
    except DataError as e:
        return None, str(e)
    if file.name == "mnist.npz":
        return file.parent, ""
    # $MIRRORFIT_DATA may name the file itself, under any name: the tests want its folder
    folder = Path(tempfile.mkdtemp(prefix="mirrorfit-tests-mnist-"))
    (folder / "mnist.npz").symlink_to(file.resolve())
    return folder, ""


_MNIST: list[tuple[Path | None, str]] = []  # what _find_mnist said, once per process


def mnist_folder() -> Path | None:
    """The folder holding the real MNIST, found (or downloaded) on first use in this process,
    and ``$MIRRORFIT_DATA`` set to it: this process and every program it starts find the same
    file. None where it cannot be had (:func:`mnist_dir` then fails the tests that need it)."""
    if not _MNIST:
        _MNIST.append(_find_mnist())
        if _MNIST[0][0] is not None:
            os.environ["MIRRORFIT_DATA"] = str(_MNIST[0][0])
    return _MNIST[0][0]


def _fork_python_programs() -> None:
    """Fork the Python programs this test process starts (tests/forkserver.py), from servers
    it starts on first use, their sockets in a folder removed at exit."""
    if os.environ.get(OFF) == "0":
        return
    import atexit
    import shutil

    folder = os.environ[SOCKETS] = tempfile.mkdtemp(prefix="mirrorfit-forkservers-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    forked.install(start_servers=True)


_fork_python_programs()


def _env() -> dict[str, str]:
    return dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]),
    )


def fresh_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: the tests' environment) for a new interpreter, not a fork of a
    preloaded one: for a program that checks what its imports load."""
    return dict(_env() if env is None else env, **{OFF: "0"})


def keras_file_weights(path: Path) -> list:
    """The weight arrays of a ``.keras`` file (a zip holding an .h5 of them), sorted by their
    path in the file."""
    import io
    import zipfile

    import h5py

    with zipfile.ZipFile(path) as z, h5py.File(io.BytesIO(z.read("model.weights.h5"))) as f:
        out = []
        f.visititems(
            lambda name, obj: out.append((name, obj[()])) if isinstance(obj, h5py.Dataset) else None
        )
    return [w for _, w in sorted(out, key=lambda item: item[0])]


def run_isolated(driver: Path, *args: object, timeout: float = 300, fresh: bool = False) -> dict:
    """Run the program ``driver`` (a file beside its test, ``*_driver.py``) with ``args`` (each
    as str()) in a process of its own, as ``python DRIVER ARGS`` (:func:`_python`); return the
    JSON object on its last stdout line. ``fresh``: a new interpreter, not a fork of a
    preloaded one (a program that checks what its imports load)."""
    proc = _python([str(driver), *map(str, args)], timeout=timeout, fresh=fresh)
    if proc.returncode != 0:
        raise AssertionError(f"subprocess failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def assert_same_weights(a: list, b: list, *, rtol: float, atol: float) -> None:
    """Two models' weights, array by array, equal within the tolerances (and some weights:
    two empty lists are not a pass)."""
    import numpy as np

    assert len(a) == len(b) > 0, (len(a), len(b))
    for wa, wb in zip(a, b):
        # strict: a scalar is not "close" to a whole array; NaN is never close to NaN
        np.testing.assert_allclose(wa, wb, rtol=rtol, atol=atol, equal_nan=False, strict=True)


def run_cli(
    *args: str,
    timeout: float = 600,
    without_tensorflow: bool = False,
    without: tuple[str, ...] = (),
    fresh: bool = False,
) -> subprocess.CompletedProcess:
    """Run ``mirrorfit ARGS`` as a user would, ``python -m mirrorfit.cli ARGS`` in a process of
    its own (:func:`_python`).

    ``without_tensorflow``: in a process where importing TensorFlow fails, so that an error
    that still comes back as mirrorfit's one line was found before TensorFlow loads.
    ``without``: the same for these top-level modules (an install without an extra).
    ``fresh``: a new interpreter, not a fork of the preloaded one."""
    blocked = [*(["tensorflow"] if without_tensorflow else []), *without]
    if not blocked:
        return _python(["-m", "mirrorfit.cli", *args], timeout=timeout, fresh=fresh)
    argv = [str(BLOCKED_CLI), ",".join(blocked), *args]
    return _python(argv, timeout=timeout, fresh=fresh)


def _python(argv: list[str], *, timeout: float, fresh: bool) -> subprocess.CompletedProcess:
    """``python ARGV`` in the tests' environment, from the repository root: forked from a
    preloaded interpreter where that is sound (tests/forkserver.py) unless ``fresh``."""
    env = fresh_env() if fresh else _env()
    return subprocess.run(
        [sys.executable, *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=ROOT,
    )


# Root's powers over permissions: CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER.
_POWERS = (1 << 1) | (1 << 2) | (1 << 3)


def permissions_apply() -> list[str]:
    """The argv prefix under which permissions apply to this user: [] where they already do,
    else setpriv dropping root's powers over them (so permission tests run under CI's root
    too); pytest.skip where neither is possible."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            caps = int(next(ln for ln in f if ln.startswith("CapEff:")).split()[1], 16)
    except (OSError, StopIteration):  # not Linux: no capabilities; root passes them all
        caps = _POWERS if os.geteuid() == 0 else 0
    if not caps & _POWERS:
        return []
    prefix = ["setpriv", "--inh-caps=-all", "--bounding-set=-dac_override,-dac_read_search,-fowner"]
    probe = subprocess.run([*prefix, "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(
            f"this user passes permissions and setpriv cannot drop that here: "
            f"{(probe.stderr or 'no setpriv').strip()}"
        )
    return prefix


@pytest.fixture(autouse=True)
def _keras_backend_as_it_was():
    """mirrorfit.setup and the CLI set $KERAS_BACKEND in this process: put it back after each
    test, so that later tests' subprocesses get the suite's environment, not a leftover."""
    before = os.environ.get("KERAS_BACKEND")
    yield
    if before is None:
        os.environ.pop("KERAS_BACKEND", None)
    else:
        os.environ["KERAS_BACKEND"] = before


@pytest.fixture(scope="session", autouse=True)
def _mnist_for_every_program() -> None:
    """MNIST found (or downloaded) before a test process's first test, not when the suite is
    imported: the programs the tests start read it through ``$MIRRORFIT_DATA``."""
    mnist_folder()


@pytest.fixture(scope="session")
def mnist_dir() -> Path:
    folder = mnist_folder()
    if folder is None:
        pytest.fail(f"real MNIST not found: {_MNIST[0][1]}")
    return folder


def pytest_collection_modifyitems(config, items):
    """Files with slow tests (real MNIST, several processes) first, each file's tests in their
    order: the two test processes take whole files (`--dist loadfile`), and a slow file
    reached last ran alone on one of them for the suite's last 3-4 minutes."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)
