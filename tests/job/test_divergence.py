"""A run whose numbers stop being finite ends, exit 65, instead of training NaNs to `done` and
exporting them (fitting/guards.py; checkpoints and exports refuse NaN weights): on both
engines, through mirrorfit train (built-in and compiled models) and mirrorfit.fit."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli


pytestmark = pytest.mark.slow
SMALL = ("--train-examples", "2000", "--epochs", "2", "--no-progress")


def _state(folder: Path) -> list[np.ndarray]:
    """The float arrays of a checkpoint (Keras's weights file, the optimizer's slots with them)."""
    import h5py

    found: list[np.ndarray] = []
    with h5py.File(folder / "state.weights.h5", "r") as f:
        f.visititems(
            lambda _, v: (
                found.append(v[()]) if isinstance(v, h5py.Dataset) and v.dtype.kind == "f" else None
            )
        )
    return found


@pytest.mark.parametrize("backend", ["jax", "tensorflow"])
def test_a_diverging_run_stops_keeping_its_last_finite_checkpoint(backend, tmp_path):
    ckpt = tmp_path / "ckpt"
    proc = run_cli(
        "train",
        "--backend",
        backend,
        "--lr",
        "1e30",
        *SMALL,
        "--checkpoint-dir",
        str(ckpt),
        "--checkpoint-every",
        "1",
        "--steps-per-execution",
        "1",
        "--metrics-out",
        str(tmp_path / "m.json"),
    )
    assert proc.returncode == 65, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "mirrorfit: error: the training loss is nan after step 2 of epoch 1 (last finite: "
    ), last
    kept = "epoch-000000-step-000001"
    assert (
        f"after step 1 of epoch 1); stopped; the newest checkpoint is {ckpt}/{kept}; "
        "try a lower learning rate" in last
    ), last
    assert "done:" not in proc.stderr and not (tmp_path / "m.json").exists()
    assert [p.name for p in ckpt.glob("epoch-*")] == [kept]
    state = _state(ckpt / kept)
    assert state and all(np.isfinite(a).all() for a in state)


def test_nan_weights_are_trained_on_request_but_never_checkpointed(tmp_path):
    ckpt, models = tmp_path / "ckpt", tmp_path / "models" / "m"
    trained = run_cli(
        "train",
        "--backend",
        "jax",
        "--lr",
        "1e30",
        *SMALL,
        "--allow-nan",
        "--checkpoint-dir",
        str(ckpt),
    )
    assert trained.returncode == 0, trained.stderr[-3000:]  # Keras's behaviour, asked for
    assert "loss nan" in trained.stderr
    # a checkpoint of NaNs is never written, so that a resume starts from finite weights
    assert "no checkpoint written" in trained.stderr, trained.stderr[-3000:]
    assert not list(ckpt.glob("epoch-*"))
    refused = run_cli("export", "--checkpoint-dir", str(ckpt), "--export-dir", str(models))
    assert refused.returncode == 2 and "no checkpoint in" in refused.stderr, refused.stderr
    assert not models.exists()


@pytest.mark.parametrize(
    "backend,saved", [("jax", False), ("tensorflow", False), ("tensorflow", True)]
)
def test_nan_weights_under_a_finite_loss_stop_at_the_epoch_end(backend, saved, tmp_path):
    """One NaN pixel in a dataset (arrays are refused before training, exit 2): on TensorFlow
    the loss averaged stayed finite (1.38) while the weights went NaN, and the run ended
    `done`, exit 0. With --checkpoint-dir its epoch-end save is the check."""
    ckpt = ("--checkpoint-dir", str(tmp_path / "ck")) if saved else ()
    proc = run_cli(
        "train",
        "--backend",
        backend,
        "--data",
        "data_fixtures:one_nan_dataset_source",
        "--epochs",
        "2",
        "--steps-per-execution",
        "1",
        "--no-progress",
        *ckpt,
    )
    assert proc.returncode == 65, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert (
        "weights are not finite (mlp/dense/kernel: " in last or "the training loss is nan" in last
    ), last
    assert "done:" not in proc.stderr
    if saved:
        assert not list((tmp_path / "ck").glob("epoch-*"))


def test_nan_arrays_are_refused_before_training():
    """Arrays are read whole: a NaN in them is named, row and all, before a step trains."""
    proc = run_cli(
        *("train", "--data", "data_fixtures:one_nan_source", "--epochs", "1", "--no-progress")
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .startswith(
            "mirrorfit: error: x holds nan (row 3); the loss of the batch holding it would be NaN"
        )
    ), proc.stderr[-3000:]


@pytest.mark.parametrize("backend", ["jax", "tensorflow"])
@pytest.mark.parametrize(
    "model",
    [
        ("mlp",),
        # through mirrorfit.fit, whose Keras LossScaleOptimizer skips the steps
        ("user_models:sized", "--loss", "sparse_categorical_crossentropy"),
    ],
    ids=["built-in", "compiled"],
)
def test_an_fp16_run_whose_every_update_was_skipped_fails(backend, model, tmp_path):
    """Exit 65, and again on the rerun that resumes from its checkpoint (a hostile pass of
    e3acabe: the compiled model's rerun resumed past the last epoch and exited 0)."""
    args = (
        *("train", "--backend", backend, "--model", *model),
        *("--data", "data_fixtures:overflowing_source", "--precision", "fp16", "--epochs", "1"),
        *("--steps-per-execution", "5", "--no-progress", "--allow-nan"),
        *("--checkpoint-dir", str(tmp_path / "ck")),
    )
    proc = run_cli(*args)
    assert proc.returncode == 65, proc.stderr[-3000:]
    rerun = run_cli(*args)
    assert rerun.returncode == 65, rerun.stderr[-3000:]
    assert "skipped" in rerun.stderr.strip().splitlines()[-1], rerun.stderr[-3000:]
    if model[0] != "mlp":  # the optimizer compiled, not Keras's wrapper (LossScaleOptimizer)
        assert "optimizer: SGD 0.01 with fp16 loss scaling, " in proc.stderr, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "mirrorfit: error: every one of the 20 optimizer steps was skipped for non-finite fp16 "
        "gradients: the weights never changed; scale the inputs down, "
    ), last


def test_an_fp16_loss_that_overflows_names_the_inputs_not_only_the_rate():
    """Inputs past float16's range: a lower learning rate cannot help, and the line says so
    (a Keras user's trial of e3acabe read only "try a lower learning rate")."""
    proc = run_cli(
        *("train", "--model", "user_models:sized", "--loss", "sparse_categorical_crossentropy"),
        *("--data", "data_fixtures:overflowing_source", "--precision", "fp16"),
        *("--epochs", "1", "--steps-per-execution", "5", "--no-progress"),
    )
    assert proc.returncode == 65, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert "the training loss is nan" in last, last
    assert "try a lower learning rate; under fp16, inputs scaled down or bf16 (--precision)" in last


def test_a_compiled_model_that_diverges_stops_too(tmp_path):
    proc = run_cli(
        "train",
        "--backend",
        "jax",
        "--model",
        "keras_models:diverging",
        "--data",
        "keras_models:regression_data",
        "--epochs",
        "3",
        "--steps-per-execution",
        "2",
        "--no-progress",
        "--save-keras",
        str(tmp_path / "m.keras"),
    )
    assert proc.returncode == 65, proc.stderr[-3000:]
    assert (
        proc.stderr.strip().splitlines()[-1].startswith("mirrorfit: error: the training loss is ")
    )
    assert "after step 2 of epoch 1 (" in proc.stderr and "; stopped; try a lower" in proc.stderr
    assert not (tmp_path / "m.keras").exists()
