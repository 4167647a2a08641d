"""A compiled ``--model`` under ``--strategy parameter-server``, trained through
``mirrorfit.fit`` (engine/tensorflow/coordinated_fit.py): ``mirrorfit launch --ps 1 --
mirrorfit train``, real processes on loopback (a chief, workers, a ps)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, _env, keras_file_weights

pytestmark = pytest.mark.slow

COMMON = (
    "--model",
    "user_models:compiled_adam",
    "--epochs",
    "2",
    "--train-examples",
    "3000",
    "--batch-size",
    "64",
    "--steps-per-execution",
    "4",
    "--no-progress",
)


def _train(tmp_path, name, *args, workers=None, extra_env=None):
    """``mirrorfit train COMMON ARGS`` (launched with ``workers`` and one ps where given),
    its outputs in ``tmp_path/name``: (returncode, log, summary or None, weights or None)."""
    out = tmp_path / name
    out.mkdir(exist_ok=True)
    outputs = ("--metrics-out", str(out / "m.json"), "--save-keras", str(out / "m.keras"))
    train = ["mirrorfit", "train", *COMMON, *args, *outputs]
    if workers is None:
        argv = [sys.executable, "-m", *train, "--backend", "tensorflow"]
    else:
        launch = ["launch", "--workers", str(workers), "--ps", "1", "--"]
        argv = [sys.executable, "-m", "mirrorfit", *launch, *train]
        argv += ["--strategy", "parameter-server"]
    proc = subprocess.run(
        argv,
        env=dict(_env(), TMPDIR=str(tmp_path), **(extra_env or {})),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    log = proc.stdout + proc.stderr
    done = (out / "m.json").exists()
    summary = json.loads((out / "m.json").read_text()) if done else None
    weights = keras_file_weights(out / "m.keras") if done else None
    return proc.returncode, log, summary, weights


def test_two_workers_train_the_compiled_model_each_step_counted_once(tmp_path):
    checkpoints = ("--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-every", "8")
    code, log, summary, _ = _train(tmp_path, "two", *checkpoints, workers=2)
    assert code == 0, log[-4000:]
    assert "(trained through mirrorfit.fit)" in log and "optimizer: Adam" in log
    assert summary["strategy"] == "ParameterServerStrategyV2" and summary["workers"] == 2
    # steps: the optimizer's iterations, read from the ps: every worker's increments landed,
    # none lost to two workers racing (atomic there)
    assert summary["steps"] == 2 * -(-3000 // 64)
    assert summary["test_examples"] == 10_000 and summary["test_accuracy"] > 0.8
    assert "[chief] done:" in log and "[worker 0] done:" not in log
    names = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert names[-1] == "epoch-000002"  # mirrorfit.fit's checkpoints


def test_one_worker_equals_one_process_and_a_preempted_run_resumes_to_it(tmp_path):
    """One worker runs the steps in order: the arithmetic of one process, bit for bit, also
    after a SIGTERM inside epoch 2 (exit 75) and a rerun that resumes."""
    code, log, _, whole = _train(tmp_path, "whole")
    assert code == 0, log[-4000:]
    resumed = (
        "--checkpoint-dir",
        str(tmp_path / "ckpt"),
        "--checkpoint-every",
        "8",
        "--callbacks",
        "user_models:terminate_once",
    )
    mark = {"MIRRORFIT_TEST_STOP_MARK": str(tmp_path / "stopped")}
    code, log, _, _ = _train(tmp_path, "ps", *resumed, workers=1, extra_env=mark)
    assert code == 75, log[-4000:]
    assert (tmp_path / "stopped").exists()
    code, log, summary, weights = _train(tmp_path, "ps", *resumed, workers=1, extra_env=mark)
    assert code == 0, log[-4000:]
    assert "resum" in log.lower(), log[-3000:]
    assert summary["steps"] == 2 * -(-3000 // 64) > summary["steps_this_run"]
    assert len(weights) == len(whole)
    for a, b in zip(weights, whole):
        np.testing.assert_array_equal(a, b)


def test_a_model_with_its_own_train_step_is_refused_in_one_line(tmp_path):
    code, log, summary, _ = _train(
        tmp_path, "own", "--model", "user_models:own_train_step", workers=1
    )
    assert code == 2 and summary is None, log[-3000:]
    assert "_OwnStep's own train_step under parameter servers" in log
    assert "Traceback" not in log


@pytest.mark.parametrize(
    "args, needle",
    [
        (
            ("--model", "user_models:compiled_iou"),
            "the metric mean_io_u (MeanIoU) updates its state with an assign, and under "
            "parameter servers two workers' assigns lose each other's updates",
        ),
        (
            ("--model", "user_models:compiled_two_outputs", "--data", "user_models:two_targets"),
            "a model of several outputs (a, b) under parameter servers with several workers",
        ),
    ],
)
def test_what_two_workers_would_race_on_is_refused_in_one_line(args, needle, tmp_path):
    code, log, summary, _ = _train(tmp_path, "refused", *args, workers=2)
    assert code == 2 and summary is None, log[-3000:]
    assert needle in log and "Traceback" not in log


def test_a_model_with_its_own_compute_loss_trains_as_in_one_process(tmp_path):
    """Keras's own train_step, calling the model's compute_loss, runs in the scheduled steps:
    with one worker, a one-process run's weights and figures."""
    model = ("--model", "user_models:own_compute_loss")
    code, log, one, whole = _train(tmp_path, "whole", *model)
    assert code == 0, log[-4000:]
    code, log, ps, weights = _train(tmp_path, "ps", *model, workers=1)
    assert code == 0, log[-4000:]
    for key in ("final_train_loss", "final_train_accuracy", "test_loss", "test_accuracy"):
        assert ps[key] == one[key], key
    for a, b in zip(weights, whole):
        np.testing.assert_array_equal(a, b)
