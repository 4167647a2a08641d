"""checkpoint: step-exact resume after SIGTERM, crash-safe writes, clear errors for corrupt or
foreign checkpoints, and independence from the replica count. All through real processes."""

import os
import random
import signal
import subprocess
import sys
import time

import keras
import numpy as np
import pytest

from conftest import ROOT, _env, run_cli, run_isolated

pytestmark = pytest.mark.slow

# The CNN has Dropout, so this also checks that the RNG state is checkpointed.
RUN = ["train", "--model", "cnn", "--train-examples", "1024", "--epochs", "4",
       "--global-batch-size", "32", "--steps-per-execution", "2", "--checkpoint-every", "8",
       "--no-progress"]


def _weights(path):
    return keras.saving.load_model(path).get_weights()


def test_sigterm_then_resume_gives_the_uninterrupted_weights(tmp_path):
    ref = run_cli(*RUN, "--checkpoint-dir", str(tmp_path / "a"), "--save-keras",
                  str(tmp_path / "a.keras"))
    assert ref.returncode == 0, ref.stderr[-3000:]

    cmd = [*RUN, "--checkpoint-dir", str(tmp_path / "b"), "--save-keras",
           str(tmp_path / "b.keras"), "--export-dir", str(tmp_path / "models" / "m")]
    proc = subprocess.Popen([sys.executable, "-m", "mirrorfit.cli", *cmd], env=_env(), cwd=ROOT,
                            stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:  # wait until training has started, then at a random moment
        if line.startswith("epoch 1/4"):
            break
    time.sleep(random.uniform(0.0, 1.5))
    proc.send_signal(signal.SIGTERM)
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 75, err[-3000:]  # the documented preemption exit code
    assert "preempted by SIGTERM" in err and "rerun the same command" in err
    assert not (tmp_path / "models" / "m").exists()  # an interrupted run exports nothing

    resumed = run_cli(*cmd)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from" in resumed.stderr
    assert sorted(os.listdir(tmp_path / "models" / "m")) == ["0001"]
    for a, b in zip(_weights(tmp_path / "a.keras"), _weights(tmp_path / "b.keras")):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


CRASH = """
import json, os, signal, keras, mirrorfit
from mirrorfit.checkpoint import Checkpointer
setup = mirrorfit.configure_devices(replicas=1)
strategy = mirrorfit.build_strategy(setup)
data = mirrorfit.load_mnist(train_examples=256, download=False)
trainer = mirrorfit.Trainer(strategy=strategy, model=mirrorfit.models.mlp,
                            optimizer=keras.optimizers.Adam(1e-3),
                            loss=keras.losses.SparseCategoricalCrossentropy(), global_batch=32)
ckpt = Checkpointer({dir!r}, trainer=trainer, model_spec="mlp")
if {crash}:
    ckpt.restore_latest()
    trainer.fit(mirrorfit.train_batches(data.x_train, data.y_train, global_batch=32, seed=0),
                epochs=trainer.epoch + 1)
    real_rename = os.rename
    os.rename = lambda *a: os.kill(os.getpid(), signal.SIGKILL)  # die at the commit point
    ckpt.save()
else:
    restored = ckpt.restore_latest()
    weights_ok = bool(trainer.model.get_weights()[0].any())
    print(json.dumps({{"step": restored and restored.step, "epoch": restored and restored.epoch,
                      "ok": weights_ok}}))
"""


def test_kill_9_during_a_save_leaves_the_previous_checkpoint_loadable(tmp_path):
    d = tmp_path / "ckpt"
    run_cli("train", "--train-examples", "256", "--epochs", "1", "--global-batch-size", "32",
            "--optimizer", "adam", "--lr", "0.001", "--checkpoint-dir", str(d), "--no-progress")
    assert [p.name for p in d.iterdir()] == ["ckpt-000000008"]
    crashed = subprocess.run([sys.executable, "-c", CRASH.format(dir=str(d), crash=True)],
                             env=_env(), cwd=ROOT, capture_output=True, text=True)
    assert crashed.returncode == -signal.SIGKILL
    assert any(p.name.startswith(".ckpt-000000016.tmp") for p in d.iterdir())  # half-written
    after = run_isolated(CRASH.format(dir=str(d), crash=False))
    assert after == {"step": 8, "epoch": 1, "ok": True}


def test_corrupt_checkpoint_is_named_and_fresh_starts_over(tmp_path):
    d = tmp_path / "ckpt"
    args = ["train", "--train-examples", "256", "--epochs", "1", "--checkpoint-dir", str(d),
            "--no-progress"]
    assert run_cli(*args).returncode == 0
    (data_file,) = (d / "ckpt-000000008").glob("state.data-*")
    data_file.write_bytes(b"\0" * 100)
    bad = run_cli(*args, "--epochs", "2")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "ckpt-000000008 cannot be read" in bad.stderr and "--fresh" in bad.stderr
    fresh = run_cli(*args, "--epochs", "2", "--fresh")
    assert fresh.returncode == 0, fresh.stderr[-2000:]
    assert "moved the existing checkpoints" in fresh.stderr
    assert (d / "ckpt-000000016").is_dir()


def test_checkpoint_of_another_model_is_refused_clearly(tmp_path):
    d = tmp_path / "ckpt"
    assert run_cli("train", "--train-examples", "256", "--epochs", "1", "--checkpoint-dir",
                   str(d), "--no-progress").returncode == 0
    other = run_cli("train", "--model", "user_models:tiny", "--train-examples", "256",
                    "--epochs", "2", "--checkpoint-dir", str(d), "--no-progress")
    assert other.returncode == 2
    assert "written by another run (model differ: 'mlp' vs 'user_models:tiny')" in other.stderr


def test_two_replicas_resume_on_one(tmp_path):
    d = tmp_path / "ckpt"
    args = ["train", "--train-examples", "512", "--global-batch-size", "64",
            "--checkpoint-dir", str(d), "--no-progress"]
    assert run_cli(*args, "--replicas", "2", "--epochs", "1").returncode == 0
    one = run_cli(*args, "--replicas", "1", "--epochs", "2", "--metrics-out",
                  str(tmp_path / "m.json"))
    assert one.returncode == 0, one.stderr[-2000:]
    assert "resuming from" in one.stderr and "1 epoch(s) done" in one.stderr
    assert (d / "ckpt-000000016").is_dir()
    again = run_cli(*args, "--replicas", "1", "--epochs", "2")  # the same command once more
    assert again.returncode == 0, again.stderr[-2000:]
    assert "nothing to train: 2 of 2 epochs already done" in again.stderr
