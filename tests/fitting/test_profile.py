"""`mirrorfit train --profile` with a compiled --model (fitting/profile.py): the step's time
by part, timed with the fit runner's own calls on both engines, and the state left as
trained."""

from __future__ import annotations

import json

import keras
import numpy as np
import pytest

from conftest import run_cli

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("backend", ["jax", "tensorflow"])
def test_a_compiled_model_is_profiled_and_trains_as_without(backend, tmp_path, mnist_dir):
    """On 379bc57 `--profile` was refused for a compiled --model ("it times the parts of
    mirrorfit's own step") and, on JAX, for every model."""
    common = ("train", "--backend", backend, "--replicas", "2", "--accum-steps", "2")
    common += ("--model", "keras_models:chapter_cnn", "--data-dir", str(mnist_dir))
    common += ("--train-examples", "1024", "--epochs", "2", "--no-progress")
    plain = run_cli(*common, "--save-keras", str(tmp_path / "plain.keras"))
    assert plain.returncode == 0, plain.stderr[-3000:]
    out = tmp_path / "m.json"
    profiled = run_cli(
        *common, "--profile", "--save-keras", str(tmp_path / "p.keras"), "--metrics-out", str(out)
    )
    assert profiled.returncode == 0, profiled.stderr[-3000:]
    (line,) = [ln for ln in profiled.stderr.splitlines() if ln.startswith("profile, per step")]
    assert "compute" in line and "all-reduce" in line, line
    report = json.loads(out.read_text())["profile"]
    assert sum(report["fractions"].values()) == pytest.approx(1.0)
    assert report["compute_s"] > 0 and report["all_reduce_s"] > 0 and report["step_s"] > 0
    assert report["diagnosis"].split(":")[0].endswith("bound")
    # the parts were timed on a copy of the state: the weights are the unprofiled run's
    for a, b in zip(
        keras.saving.load_model(tmp_path / "plain.keras").get_weights(),
        keras.saving.load_model(tmp_path / "p.keras").get_weights(),
    ):
        np.testing.assert_array_equal(a, b)


def test_a_model_with_its_own_train_step_is_not_profiled_in_one_line(mnist_dir):
    proc = run_cli(
        *("train", "--backend", "jax", "--model", "keras_models:digits_own_step"),
        *("--data-dir", str(mnist_dir), "--profile"),
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .startswith("mirrorfit: error: --profile: _OwnStep's own train_step is one piece")
    )


def test_a_built_in_model_is_profiled_on_jax(mnist_dir):
    """Refused until the built-in models trained through mirrorfit.fit ("--profile breaks down
    the built-in models' step on TensorFlow"): the fit runner times them on both engines."""
    proc = run_cli(
        *("train", "--backend", "jax", "--replicas", "2", "--data-dir", str(mnist_dir)),
        *("--train-examples", "1024", "--epochs", "1", "--no-progress", "--profile"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("profile, per step")]
    assert "compute" in line and "all-reduce" in line, line
