"""engine.backends: the backend is a value chosen before Keras loads; settings only one engine
has are refused in one line before any framework loads; the first screen of a run shows none
of TensorFlow's C++ start-up lines unless asked."""

import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT, _env, run_cli
from mirrorfit.engine import backends
from mirrorfit.errors import ConfigError

# An absl log line (severity, date, time, thread, file:line]) or absl's preamble
ABSL_LINE = re.compile(
    r"^([IWEF]\d{4} [\d:.]+ +\d+ \S+:\d+\]|WARNING: All log messages before "
    r"absl)",
    re.MULTILINE,
)


def test_the_backend_comes_from_the_flag_else_keras_backend_else_tensorflow(monkeypatch):
    monkeypatch.delenv("KERAS_BACKEND", raising=False)
    assert backends.resolve(None) == "tensorflow"
    monkeypatch.setenv("KERAS_BACKEND", "jax")
    assert backends.resolve(None) == "jax"
    assert backends.resolve("tensorflow") == "tensorflow"
    monkeypatch.setenv("KERAS_BACKEND", "torch")
    with pytest.raises(
        ConfigError, match="KERAS_BACKEND 'torch': mirrorfit trains on tensorflow or jax"
    ):
        backends.resolve(None)
    with pytest.raises(ConfigError, match="--backend 'mxnet'"):
        backends.resolve("mxnet")


def test_the_toml_key_sets_the_backend(tmp_path, monkeypatch):
    from mirrorfit.config import load_config

    monkeypatch.delenv("KERAS_BACKEND", raising=False)
    (tmp_path / "run.toml").write_text('backend = "jax"\n')
    assert load_config(tmp_path / "run.toml").backend == "jax"
    assert load_config(tmp_path / "run.toml", backend="tensorflow").backend == "tensorflow"


@pytest.mark.parametrize(
    "flags,says",
    [
        (
            ("--strategy", "parameter-server"),
            "--strategy parameter-server needs TensorFlow's ParameterServerStrategy",
        ),
        (
            ("--strategy", "central-storage"),
            "--strategy central-storage keeps variables on one device",
        ),
        (
            ("--cross-device-ops", "reduce-to-one"),
            "--cross-device-ops reduce-to-one chooses TensorFlow's collectives",
        ),
        (
            ("--export-dir", "models/m"),
            "then export it (with TensorFlow installed): mirrorfit export",
        ),
        # not the TensorFlow advice (--strategy mirrored, --communication) JAX refuses next
        (("--communication", "ring"), "--communication ring chooses TensorFlow's multi-worker"),
        (
            ("--cross-device-ops", "nccl", "--strategy", "multi-worker"),
            "--cross-device-ops nccl chooses TensorFlow's",
        ),
    ],
)
def test_tensorflow_only_settings_are_refused_on_jax_before_anything_loads(flags, says):
    proc = run_cli("train", "--backend", "jax", *flags, without_tensorflow=True)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("mirrorfit: error: ") and says in lines[0], lines[0]


@pytest.mark.slow
def test_the_first_screen_of_a_run_has_no_tensorflow_cpp_lines(tmp_path):
    env = {k: v for k, v in _env().items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    args = ["train", "--epochs", "1", "--train-examples", "640", "--no-progress"]
    quiet = subprocess.run(
        [sys.executable, "-m", "mirrorfit.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )
    assert quiet.returncode == 0, quiet.stderr[-2000:]
    assert quiet.stderr.splitlines()[0].startswith("mirrorfit mlp on "), quiet.stderr[:2000]
    assert not ABSL_LINE.search(quiet.stderr), quiet.stderr[:2000]
    verbose = subprocess.run(
        [sys.executable, "-m", "mirrorfit.cli", *args, "--verbose"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )
    assert verbose.returncode == 0, verbose.stderr[-2000:]
    if os.uname().machine == "x86_64":  # oneDNN's notice, at least, on every x86 host
        assert ABSL_LINE.search(verbose.stderr), verbose.stderr[:2000]


@pytest.mark.slow
def test_commands_that_need_tensorflow_say_so_in_one_line_on_a_jax_only_machine(tmp_path):
    """export, evaluate and serve gave a ModuleNotFoundError traceback where only JAX is
    installed (the install docs/jax.md describes); train and devices said it in one line."""
    ckpt = tmp_path / "ckpt"
    trained = run_cli(
        "train",
        "--backend",
        "jax",
        "--epochs",
        "1",
        "--train-examples",
        "256",
        "--no-progress",
        "--checkpoint-dir",
        str(ckpt),
        without_tensorflow=True,
    )
    assert trained.returncode == 0, trained.stderr[-3000:]
    (tmp_path / "served" / "1").mkdir(parents=True)
    for args, who in (
        (
            ("export", "--checkpoint-dir", str(ckpt), "--export-dir", str(tmp_path / "m")),
            "mirrorfit export",
        ),
        (("evaluate", "--checkpoint-dir", str(ckpt)), "mirrorfit evaluate"),
        (
            (
                "serve",
                "--model_base_path",
                str(tmp_path / "served"),
                "--model_name",
                "m",
                "--port",
                "0",
            ),
            "mirrorfit serve",
        ),
    ):  # refused before anything listens
        proc = run_cli(*args, without_tensorflow=True, timeout=120)
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        assert proc.returncode == 2 and len(lines) == 1, (args[0], proc.stderr[-3000:])
        said = (
            "needs TensorFlow: pip install 'mirrorfit[serve]'"
            if who == "mirrorfit serve"
            else "needs TensorFlow: pip install 'mirrorfit[tensorflow]'"
        )  # the extras
        assert lines[0].startswith(f"mirrorfit: error: {who}") and said in lines[0], lines[0]
    assert not (tmp_path / "m").exists()


@pytest.mark.slow
def test_a_jax_run_that_loads_tensorflow_keeps_its_cpp_lines_quiet(tmp_path):
    """TensorBoard's writer (--logdir) loads TensorFlow where it is installed, on the JAX
    engine too: its start-up lines reached the screen there, filtered only on TensorFlow's."""
    env = {k: v for k, v in _env().items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mirrorfit.cli",
            "train",
            "--backend",
            "jax",
            "--epochs",
            "1",
            "--train-examples",
            "256",
            "--no-progress",
            "--logdir",
            str(tmp_path / "tb"),
            "--save-keras",
            str(tmp_path / "m.keras"),
        ],  # Keras's saving too
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert any((tmp_path / "tb").iterdir()) and (tmp_path / "m.keras").is_file()
    assert not ABSL_LINE.search(proc.stderr), proc.stderr[:2000]


@pytest.mark.slow
def test_a_data_function_that_imports_tensorflow_keeps_its_cpp_lines_quiet():
    env = {k: v for k, v in _env().items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mirrorfit.cli",
            "train",
            "--backend",
            "jax",
            "--data",
            "data_fixtures:tensorflow_importing_source",
            "--epochs",
            "1",
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not ABSL_LINE.search(proc.stderr), proc.stderr[:2000]


@pytest.mark.slow
@pytest.mark.parametrize("output", ["--checkpoint-dir", "--save-keras"])
def test_a_compiled_models_outputs_keep_tensorflows_cpp_lines_quiet(tmp_path, output):
    """checkpoint_dir compares its layers' configs, whose serialisation asks Keras whether
    TensorFlow is there, which loads it: on 7142fc8 its oneDNN and CUDA lines (4) printed
    mid-epoch of a JAX run. Keras's .keras writer loads it too: on cdbafe7 --save-keras
    printed them twice (and wrote the file in place, not atomically as the built-in
    models' file is)."""
    env = {k: v for k, v in _env().items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    target = tmp_path / ("c" if output == "--checkpoint-dir" else "m.keras")
    proc = subprocess.run(
        [sys.executable, "-m", "mirrorfit.cli", "train", "--backend", "jax"]
        + ["--model", "keras_models:digits", "--train-examples", "256", "--epochs", "1"]
        + [output, str(target), "--no-progress"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (target / "epoch-000001").is_dir() if output == "--checkpoint-dir" else target.is_file()
    assert not ABSL_LINE.search(proc.stderr), proc.stderr[:2000]
    assert [p.name for p in tmp_path.iterdir()] == [target.name]  # no temporary file left


@pytest.mark.parametrize("flags", [(), ("--backend", "tensorflow")])
def test_without_tensorflow_train_says_what_to_install_in_one_line(flags, monkeypatch):
    """A JAX-only install (docs/jax.md): `mirrorfit train` was a ModuleNotFoundError traceback
    through Keras. The default stays TensorFlow whatever is installed: the same command must
    not resume a TensorFlow run's checkpoints on JAX on a machine that lacks TensorFlow."""
    monkeypatch.delenv("KERAS_BACKEND", raising=False)
    proc = run_cli("train", *flags, "--epochs", "1", without_tensorflow=True)
    assert proc.returncode == 2 and proc.stderr.strip() == (
        "mirrorfit: error: --backend tensorflow (the default, unless $KERAS_BACKEND says jax) "
        "needs TensorFlow: pip install 'mirrorfit[tensorflow]', or train with --backend jax"
    ), proc.stderr[-3000:]


BROKEN_TENSORFLOW = (
    'raise ImportError("Traceback (most recent call last):\\n  File x\\n'
    "ImportError: libtensorflow_framework.so.2: cannot open shared object "
    "file\\n\\n\\nFailed to load the native TensorFlow runtime.\\nSee "
    'https://www.tensorflow.org/install/errors")\n'
)


# protobuf newer than TensorFlow's generated code: a TypeError, not an ImportError
PROTOBUF_MISMATCH = (
    'raise TypeError("Descriptors cannot be created directly.\\nIf this call '
    'came from a _pb2.py file, your generated code is out of date")\n'
)


def test_tensorflow_failing_with_another_error_is_one_line_too(tmp_path):
    (tmp_path / "tensorflow").mkdir()
    (tmp_path / "tensorflow" / "__init__.py").write_text(PROTOBUF_MISMATCH)
    env = dict(_env(), PYTHONPATH=os.pathsep.join([str(tmp_path), _env()["PYTHONPATH"]]))
    proc = subprocess.run(
        [sys.executable, "-m", "mirrorfit.cli", "devices"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stderr.strip() == (
        "mirrorfit: error: TensorFlow is installed but does not load (TypeError: Descriptors "
        "cannot be created directly.); reinstall it (pip install --force-reinstall "
        "tensorflow==2.21.0), or train with --backend jax"
    ), proc.stderr[-3000:]


def test_a_broken_tensorflow_is_one_line_in_every_command(tmp_path):
    (tmp_path / "tensorflow").mkdir()
    (tmp_path / "tensorflow" / "__init__.py").write_text(BROKEN_TENSORFLOW)
    env = dict(_env(), PYTHONPATH=os.pathsep.join([str(tmp_path), _env()["PYTHONPATH"]]))
    (tmp_path / "ckpt" / "epoch-000001").mkdir(parents=True)
    (tmp_path / "ckpt" / "epoch-000001" / "meta.json").write_text("{}")
    said = (
        "mirrorfit: error: TensorFlow is installed but does not load (ImportError: "
        "libtensorflow_framework.so.2: cannot open shared object file; Failed to load the "
        "native TensorFlow runtime.); reinstall it (pip install --force-reinstall "
        "tensorflow==2.21.0)"
    )
    for args, jax_too in (
        (("train", "--backend", "tensorflow"), True),
        (("devices",), True),
        (
            (
                "export",
                "--checkpoint-dir",
                str(tmp_path / "ckpt"),
                "--export-dir",
                str(tmp_path / "m"),
            ),
            False,
        ),
        (("evaluate", "--checkpoint-dir", str(tmp_path / "ckpt")), False),
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "mirrorfit.cli", *args],
            capture_output=True,
            text=True,
            env=env,
            cwd=ROOT,
            timeout=120,
        )
        want = said + (", or train with --backend jax" if jax_too else "")
        assert proc.returncode == 2 and proc.stderr.strip() == want, (args, proc.stderr[-3000:])


@pytest.mark.parametrize(
    "platforms,said",
    [
        ("cuda", "JAX_PLATFORMS='cuda': JAX cannot start it on this host"),
        (
            "bogus",
            "JAX_PLATFORMS='bogus': JAX cannot start it on this host (Unable to initialize "
            "backend 'bogus'",
        ),
    ],
)
def test_jax_platforms_this_host_lacks_are_one_line(platforms, said):
    from mirrorfit.engine.jax.devices import _gpus  # noqa: F401 (importable without JAX's start)

    if platforms == "cuda" and _has_cuda():
        pytest.skip("this host has CUDA: JAX_PLATFORMS=cuda starts")
    for args in (("train", "--backend", "jax", "--epochs", "1"), ("devices", "--backend", "jax")):
        proc = subprocess.run(
            [sys.executable, "-m", "mirrorfit.cli", *args],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
            env=dict(_env(), JAX_PLATFORMS=platforms),
        )
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1, (args, proc.stderr[-3000:])
        assert lines[0].startswith(f"mirrorfit: error: {said}") and lines[0].endswith(
            "unset JAX_PLATFORMS to use the devices there are, or set it to "
            "cpu" + ("; for NVIDIA GPUs install jax[cuda12]" if platforms == "cuda" else "")
        ), lines[0]


def _has_cuda() -> bool:
    proc = subprocess.run(
        [sys.executable, "-c", "import jax; jax.devices('cuda')"],
        capture_output=True,
        timeout=120,
        env=dict(_env(), JAX_PLATFORMS="cuda"),
    )
    return proc.returncode == 0
