"""The suite's preloaded interpreters (tests/preloaded.py): a forked program sees what a new
process would, and a program whose Keras would run on another backend fails instead of passing."""

import json
import os
import subprocess
import time

import pytest
from conftest import ROOT, _env
from preloaded import Preloaded, keras_backend

HERE = ROOT / "tests"
PROBE = str(HERE / "preloaded_probe_driver.py")


@pytest.fixture(scope="module")
def preloaded():
    return Preloaded(import_time=("JAX_", "TF_", "XLA_", "PYTHON"))


def test_a_forked_program_gets_its_argv_env_cwd_streams_and_exit_code(preloaded, monkeypatch):
    monkeypatch.setenv("PRELOADED_PROBE", "seen")
    env = _env()
    for code in (0, 7):
        proc = preloaded.run([PROBE, str(code)], env, ROOT, 120, backend="jax")
        assert proc is not None and proc.returncode == code, proc
        seen = json.loads(proc.stdout.splitlines()[-1])
        assert seen == dict(
            argv=[PROBE, str(code)], cwd=str(ROOT), probe="seen", path0=str(HERE), main="__main__"
        )
        assert proc.stderr == "to stderr\n"


@pytest.mark.parametrize("backend, other", [("tensorflow", "jax"), ("jax", "tensorflow")])
def test_a_program_that_asks_for_another_keras_backend_fails(preloaded, backend, other):
    """Each interpreter has Keras on its backend: a program there that asks for another one
    would have had it in a new process."""
    for asks, code in ((backend, 0), (other, 3)):
        proc = preloaded.run([PROBE, "0", asks], _env(), ROOT, 120, backend=backend)
        assert proc is not None and proc.returncode == code, proc
    assert f"Keras ran on {backend}, not {other}" in proc.stderr


def _program(tmp_path, text: str) -> str:
    path = tmp_path / "program.py"
    path.write_text(text)
    return str(path)


def test_a_program_past_its_timeout_is_killed_and_its_output_kept(preloaded, tmp_path):
    sleeper = _program(tmp_path, "import time\nprint('started', flush=True)\ntime.sleep(60)\n")
    start = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as e:
        preloaded.run([sleeper], _env(), ROOT, 2, backend="jax")
    assert time.monotonic() - start < 30 and e.value.output == "started\n"
    proc = preloaded.run([PROBE, "0"], _env(), ROOT, 120, backend="jax")  # still serves
    assert proc is not None and proc.returncode == 0, proc


def test_what_a_program_leaves_behind_is_killed(preloaded, tmp_path):
    program = _program(
        tmp_path, "import subprocess\nprint(subprocess.Popen(['sleep', '60']).pid)\n"
    )
    proc = preloaded.run([program], _env(), ROOT, 60, backend="jax")
    assert proc is not None and proc.returncode == 0, proc
    left = int(proc.stdout)
    for _ in range(50):  # killed, then reaped by init
        try:
            os.kill(left, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    raise AssertionError(f"process {left} outlived the program that started it")


@pytest.mark.parametrize(
    "text, code",
    [
        ("raise KeyboardInterrupt", -2),  # as Python ends on Ctrl-C: killed by SIGINT
        ("import os\nos.environ['KERAS_BACKEND'] = 'tensorflow'\nos._exit(0)", 3),
        ("import sys\nsys.exit('bad')", 1),
    ],
)
def test_every_way_out_gives_a_new_process_s_exit_code(preloaded, tmp_path, text, code):
    proc = preloaded.run([_program(tmp_path, text)], _env(), ROOT, 60, backend="jax")
    assert proc is not None and proc.returncode == code, proc


def test_children_do_not_share_numpy_s_global_random_state(preloaded, tmp_path):
    program = _program(tmp_path, "import numpy\nprint(numpy.random.randint(1 << 30))\n")
    draws = {preloaded.run([program], _env(), ROOT, 60, backend="jax").stdout for _ in range(3)}
    assert len(draws) == 3, draws


def test_other_import_time_settings_get_a_new_process(preloaded, monkeypatch):
    assert preloaded.run([PROBE, "0"], _env(), ROOT, 120, backend="jax") is not None
    monkeypatch.setenv("JAX_ENABLE_X64", "1")
    assert preloaded.run([PROBE, "0"], _env(), ROOT, 120, backend="jax") is None


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
        ([str(HERE / "engine" / "jax" / "uneven_eval_driver.py")], {}, "jax"),  # blocks TF
    ],
)
def test_the_backend_a_program_will_use(argv, env, backend):
    assert keras_backend(argv, env) == backend
