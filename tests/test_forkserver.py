"""The suite's fork servers (tests/forkserver.py, tests/forked.py): a forked program sees what a
new process would, ``subprocess.Popen`` works on it as on any child, and a program whose Keras
would run on another backend fails instead of passing."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import ROOT, _env
from forkserver import OFF, keras_backend, server_for

HERE = ROOT / "tests"
PROBE = str(HERE / "forkserver_probe_driver.py")
BLOCKED = str(HERE / "blocked_cli_driver.py")


def _probe(*args: str, env: dict | None = None, **kwargs) -> tuple:
    """(the finished probe, what it saw)."""
    proc = subprocess.run(
        [sys.executable, PROBE, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env or _env(),
        cwd=kwargs.pop("cwd", ROOT),
        **kwargs,
    )
    return proc, json.loads(proc.stdout.splitlines()[-1])


def test_a_forked_program_gets_its_argv_env_folder_streams_and_exit_code(tmp_path):
    env = dict(_env(), FORKSERVER_PROBE="seen", PYTHONPATH=f"{tmp_path}{os.pathsep}relative")
    for code in (0, 7):
        proc, seen = _probe(str(code), "jax", env=env, cwd=tmp_path)
        assert proc.returncode == code and proc.stderr == "to stderr\n", proc
        assert seen["loaded"] == ["jax", "keras"]  # forked from JAX's server: no TensorFlow
        assert seen["argv"] == [PROBE, str(code), "jax"] and seen["cwd"] == str(tmp_path)
        assert seen["probe"] == "seen" and seen["main"] == "__main__"
        assert seen["path"][:3] == [str(HERE), str(tmp_path), str(tmp_path / "relative")]
        assert str(ROOT / "tests") not in seen["path"][3:]  # the server's PYTHONPATH is gone


def test_a_forked_program_is_in_the_asker_s_group_or_a_session_of_its_own():
    _, seen = _probe("0", "jax")
    assert (seen["group"], seen["session"]) == (os.getpgid(0), os.getsid(0))
    assert seen["cpus"] == sorted(os.sched_getaffinity(0)) and seen["umask"] == _umask()
    _, seen = _probe("0", "jax", start_new_session=True)
    assert seen["group"] == seen["session"] != os.getsid(0)


def _umask() -> int:
    mask = os.umask(0o22)
    os.umask(mask)
    return mask


def test_other_import_time_settings_or_preload_off_get_a_new_process(tmp_path):
    assert _probe("0", "jax")[1]["loaded"] == ["jax", "keras"]
    assert _probe("0", "jax", env=dict(_env(), JAX_ENABLE_X64="1"))[1]["loaded"] == []
    assert _probe("0", "jax", env=dict(_env(), **{OFF: "0"}))[1]["loaded"] == []
    (tmp_path / "keras").mkdir()  # a stand-in Keras first on the path: not the preloaded one
    (tmp_path / "keras" / "__init__.py").write_text("")
    shadowed = dict(_env(), PYTHONPATH=os.pathsep.join([str(tmp_path), _env()["PYTHONPATH"]]))
    assert _probe("0", "jax", env=shadowed)[1]["loaded"] == []


@pytest.mark.parametrize("backend, other", [("tensorflow", "jax"), ("jax", "tensorflow")])
def test_a_program_that_asks_for_another_keras_backend_fails(backend, other):
    """Each server has Keras on its backend: a program there that asks for another one would
    have had it in a new process."""
    for asks, code in ((backend, 0), (other, 3)):
        proc, _ = _probe("0", asks, env=dict(_env(), MIRRORFIT_TESTS_KERAS_BACKEND=backend))
        assert proc.returncode == code, proc
    assert f"Keras ran on {backend}, not {other}" in proc.stderr


def _program(tmp_path, text: str) -> list[str]:
    path = tmp_path / "program.py"
    path.write_text(f'import sys\nsys.modules["tensorflow"] = None\n{text}')  # on JAX's server
    return [sys.executable, str(path)]


def test_popen_reads_terminates_and_times_out_a_forked_program(tmp_path):
    program = _program(tmp_path, "import time\nprint('started', flush=True)\ntime.sleep(60)\n")
    proc = subprocess.Popen(program, stdout=subprocess.PIPE, text=True, env=_env())
    assert proc.stdout.readline() == "started\n" and proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == -signal.SIGTERM
    proc.stdout.close()
    start = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as e:
        subprocess.run(program, capture_output=True, text=True, timeout=2, env=_env())
    assert time.monotonic() - start < 30 and e.value.output == b"started\n"


def test_a_forked_program_s_own_python_programs_are_forked_too(tmp_path):
    inner = [sys.executable, "-c", "import sys; print(sys.modules.get('jax') is not None)", "jax"]
    text = f"import subprocess\nsubprocess.run({inner!r})\n"
    proc = subprocess.run(_program(tmp_path, text), capture_output=True, text=True, env=_env())
    assert proc.stdout == "True\n", proc


@pytest.mark.parametrize(
    "text, code",
    [
        ("raise KeyboardInterrupt", -2),  # as Python ends on Ctrl-C: killed by SIGINT
        ("import os\nos.environ['KERAS_BACKEND'] = 'tensorflow'\nos._exit(0)", 3),
        ("sys.exit('bad')", 1),
        ("sys.exit(-1)", 255),  # an exit code, not a signal
    ],
)
def test_every_way_out_gives_a_new_process_s_exit_code(tmp_path, text, code):
    proc = subprocess.run(_program(tmp_path, text), capture_output=True, env=_env(), timeout=60)
    assert proc.returncode == code, proc


def test_a_forked_program_ends_as_python_ends_a_program(tmp_path):
    """Threads joined, atexit handlers run, an unclosed file flushed, in that order (on both
    servers: not by the interpreter's teardown, which the children skip)."""
    out = tmp_path / "out.txt"
    text = (
        "import atexit, threading, time\n"
        f"f = open({str(out)!r}, 'w')\n"
        "atexit.register(lambda: f.write('atexit '))\n"
        "threading.Thread(target=lambda: (time.sleep(0.5), f.write('thread '))).start()\n"
    )
    for server in ("jax", "tensorflow"):
        env = dict(_env(), MIRRORFIT_TESTS_KERAS_BACKEND=server)
        proc = subprocess.run(_program(tmp_path, text), capture_output=True, env=env, timeout=60)
        assert proc.returncode == 0 and out.read_text() == "thread atexit ", (server, proc)


def test_a_forked_program_gets_its_tmpdir_ignored_signals_and_own_folder_s_modules(tmp_path):
    """TensorFlow's import fixes tempfile's folder, a SIG_IGN outlives exec, and a module
    beside the program comes before an installed one of that name."""
    text = (
        "import signal, tempfile\n"
        "print(tempfile.gettempdir(), signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN)\n"
    )
    env = dict(_env(), TMPDIR=str(tmp_path), MIRRORFIT_TESTS_KERAS_BACKEND="tensorflow")
    previous = signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    try:
        proc = subprocess.run(_program(tmp_path, text), capture_output=True, text=True, env=env)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert proc.stdout == f"{tmp_path} True\n", proc
    (tmp_path / "numpy.py").write_text("print('the program folder numpy')\n")
    proc = subprocess.run(_program(tmp_path, "import numpy\n"), capture_output=True, text=True)
    assert proc.stdout == "the program folder numpy\n", proc


def test_children_do_not_share_numpy_s_global_random_state(tmp_path):
    program = _program(tmp_path, "import numpy\nprint(numpy.random.randint(1 << 30))\n")
    draws = {
        subprocess.run(program, capture_output=True, env=_env(), timeout=60).stdout
        for _ in range(3)
    }
    assert len(draws) == 3, draws


@pytest.mark.parametrize(
    "argv, env, backend",
    [
        (["-m", "mirrorfit.cli", "train", "--backend", "jax"], {}, "jax"),
        (["-m", "mirrorfit.cli", "train", "--backend=jax"], {}, "jax"),
        (
            ["-m", "mirrorfit.cli", "train", "--backend", "jax", "--backend", "tensorflow"],
            {},
            "tensorflow",
        ),
        ([str(HERE / "models" / "remat_driver.py"), "tensorflow", "fp32"], {}, "tensorflow"),
        (["-m", "mirrorfit.cli", "train"], {"KERAS_BACKEND": "jax"}, "jax"),
        (["-m", "mirrorfit.cli", "train"], {}, "tensorflow"),
        ([PROBE, "jax", "x"], {}, "jax"),
        ([PROBE, "tensorflow"], {"KERAS_BACKEND": "jax"}, "tensorflow"),
        ([PROBE, "0"], {"KERAS_BACKEND": "jax"}, "jax"),
        ([str(HERE / "engine" / "jax" / "all_reduces_driver.py")], {}, "jax"),  # blocks TF
        # mirrorfit's CLI without TensorFlow: only JAX's server has not imported it
        ([BLOCKED, "tensorflow", "train", "--backend", "jax"], {}, "jax"),
        ([BLOCKED, "tensorflow", "train"], {}, None),
        ([BLOCKED, "jax", "train", "--backend", "jax"], {}, None),
        (["-m", "mirrorfit.bench.point", '{"kind": "peak", "backend": "jax"}'], {}, "jax"),
        (["-u", PROBE], {}, None),  # interpreter options: a new process
        ([str(HERE / "no_such_driver.py")], {}, None),
    ],
)
def test_the_server_a_program_goes_to(argv, env, backend):
    assert server_for(argv, env, str(ROOT)) == backend
    if backend is not None:
        assert keras_backend(argv, env) == backend
