"""engine.jax.orbax_state and fit's background saves (artifacts/epoch_checkpoint.py): a
sharded run's checkpoints are Orbax's, written while training goes on; a SIGTERM during one
resumes (on 4 devices or 2) to the uninterrupted run; a damaged one is set aside; `mirrorfit
export` reads one; a failed background write is one line and leaves the previous checkpoint
the newest."""

import json
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import numpy as np
import pytest

from conftest import BLOCKED_CLI, ROOT, _env, keras_file_weights, run_cli, run_isolated

HERE = Path(__file__).parent
TRAIN = [
    "train",
    "--backend",
    "jax",
    "--train-examples",
    "2048",
    "--optimizer",
    "adam",
    "--lr",
    "0.001",
    "--no-progress",
    "--steps-per-execution",
    "2",
    "--global-batch-size",
    "64",
    "--epochs",
    "2",
]
WITHOUT_TF = [str(BLOCKED_CLI), "tensorflow"]


def _stopped_mid_run(tmp_path, *args):
    """A run saving after every execution, sent SIGTERM once its first checkpoint is there:
    whenever the signal lands, the run stops with a save in flight (each execution's save
    is still writing when the stop's is asked for)."""
    folder = tmp_path / "ck"
    proc = subprocess.Popen(
        [
            sys.executable,
            *WITHOUT_TF,
            *TRAIN,
            *args,
            "--checkpoint-dir",
            str(folder),
            "--checkpoint-every",
            "2",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
        cwd=ROOT,
    )
    deadline = time.monotonic() + 240
    while not list(folder.glob("epoch-*")) and proc.poll() is None:
        assert time.monotonic() < deadline, "no checkpoint in 240 s"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=240)
    return proc.returncode, err


@pytest.mark.slow
def test_a_sigterm_during_a_background_save_resumes_to_the_uninterrupted_run(tmp_path):
    import shutil

    code, err = _stopped_mid_run(tmp_path, "--replicas", "4", "--shard", "all")
    assert code == 75, err[-3000:]  # EXIT_PREEMPTED: saved, committed, stopped
    saved = sorted(p.name for p in (tmp_path / "ck").iterdir() if p.name != ".lock")
    assert saved and all(n.startswith("epoch-") for n in saved), saved  # no temp left
    newest = tmp_path / "ck" / saved[-1]
    assert (newest / "state").is_dir() and not (newest / "state.weights.h5").exists()
    meta = json.loads((newest / "meta.json").read_text())
    step = meta["epoch"] * 32 + meta["step_in_epoch"]  # 32 steps an epoch
    assert 0 < step < 64, step  # stopped mid-run
    shutil.copytree(tmp_path / "ck", tmp_path / "ck2")
    runs = {
        "four": ("--replicas", "4", "--shard", "all", "--checkpoint-dir", tmp_path / "ck"),
        "two": ("--replicas", "2", "--shard", "optimizer", "--checkpoint-dir", tmp_path / "ck2"),
        "whole": (
            "--replicas",
            "2",
        ),
    }
    for name, args in runs.items():
        proc = run_cli(
            *TRAIN,
            *map(str, args),
            "--save-keras",
            str(tmp_path / f"{name}.keras"),
            without_tensorflow=True,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert ("resuming from" in proc.stderr) == (name != "whole")
    whole = keras_file_weights(tmp_path / "whole.keras")
    for name in ("four", "two"):
        for a, b in zip(keras_file_weights(tmp_path / f"{name}.keras"), whole, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_a_damaged_sharded_checkpoint_is_set_aside_and_export_reads_the_previous(tmp_path):
    args = [*TRAIN, "--replicas", "2", "--shard", "all", "--checkpoint-dir", str(tmp_path / "c")]
    first = run_cli(
        *args, "--save-keras", str(tmp_path / "one.keras"), "--epochs", "1", without_tensorflow=True
    )
    assert first.returncode == 0, first.stderr[-3000:]
    exported = run_cli(
        "export", "--checkpoint-dir", str(tmp_path / "c"), "--export-dir", str(tmp_path / "m")
    )
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert "exported epoch-000001" in exported.stdout, exported.stdout
    assert run_cli(*args, without_tensorflow=True).returncode == 0
    for chunk in (tmp_path / "c" / "epoch-000002" / "state" / "d").iterdir():
        chunk.write_bytes(chunk.read_bytes()[:100])  # a power loss: the end never written
    resumed = run_cli(*args, "--epochs", "3", without_tensorflow=True)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "epoch-000002 cannot be read" in resumed.stderr, resumed.stderr[-3000:]
    assert "resuming from" in resumed.stderr and "epoch-000001" in resumed.stderr
    assert "Traceback" not in resumed.stderr and "WARNING" not in resumed.stderr
    # The export of step 32 predicts as the model the run saved at step 32.
    got = run_isolated(
        HERE / "export_against_keras_driver.py", tmp_path / "m" / "0001", tmp_path / "one.keras"
    )
    assert got["spread"] > 0.01 and got["diff"] < 1e-5, got


# -- fast: the checks and the Checkpointer's background commit ------------------------------------
def test_a_saved_array_of_another_shape_or_dtype_is_refused_before_anything_is_read():
    from mirrorfit.artifacts.checkpoint_meta import StructureError
    from mirrorfit.engine.jax.orbax_state import check_against

    def want(*arrays):
        return {"trainable": list(arrays), "non_trainable": [], "optimizer": []}

    saved = {"trainable": [((4, 2), np.dtype("float32"))], "non_trainable": [], "optimizer": []}
    names = {"trainable": ["dense/kernel"], "non_trainable": [], "optimizer": []}
    check_against(saved, want(np.zeros((4, 2), np.float32)), names)
    with pytest.raises(StructureError, match=r"shape \[4, 2\], this run's dense/kernel \[2, 4\]"):
        check_against(saved, want(np.zeros((2, 4), np.float32)), names)
    with pytest.raises(StructureError, match="1 trainable variables saved, this run has 2"):
        check_against(
            saved, want(np.zeros((4, 2)), np.zeros(1)), {**names, "trainable": ["a", "b"]}
        )
    with pytest.raises(ValueError, match="state/trainable/0 is float32, not dense/kernel's int32"):
        check_against(saved, want(np.zeros((4, 2), np.int32)), names)


class _Failing:
    """A split engine state whose background write fails after the save returned."""

    split, collective = True, False

    def __init__(self, error):
        self.error, self.written = error, []

    def write(self, folder):
        (folder / "part").write_text("half")
        self.written.append(folder)
        return types.SimpleNamespace(wait=self._fail)

    def _fail(self):
        time.sleep(0.05)
        raise self.error


def _save(tmp_path, state):
    """``mirrorfit.fit``'s save of a small model at epoch 1 into ``tmp_path``, with ``state``:
    (its path, the commit running in the background)."""
    import keras

    from mirrorfit.artifacts import epoch_checkpoint

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    return epoch_checkpoint.save(model, tmp_path, epoch_checkpoint.Position(1), None, state=state)


@pytest.mark.parametrize(
    "error, kind, says",
    [
        (OSError(28, "No space left on device"), "StorageError", "disk full while writing"),
        (
            RuntimeError("tensorstore: write failed"),
            "CheckpointError",
            "failed (RuntimeError: tensorstore: write failed)",
        ),
    ],
)
def test_a_failed_background_write_is_one_line_and_commits_nothing(tmp_path, error, kind, says):
    state = _Failing(error)
    path, commit = _save(tmp_path, state)  # returns while the write goes on
    assert path.name == "epoch-000001" and state.written and commit is not None
    commit.join()
    with pytest.raises(Exception) as raised:
        commit.result()
    assert type(raised.value).__name__ == kind and says in str(raised.value)
    assert "none was written" in str(raised.value)
    assert "\n" not in str(raised.value)
    assert list(tmp_path.iterdir()) == []  # neither the checkpoint nor its temp folder
    commit.result()  # raised once


def test_a_flipped_byte_that_orbax_reads_is_caught_by_the_checksums(tmp_path):
    got = run_isolated(HERE / "flipped_byte_driver.py", tmp_path)
    assert got["whole"] is True
    assert got["said"] == "state/trainable/0 does not match its checksum: the data is damaged"


def test_a_stale_shared_temp_that_is_a_file_or_a_link_is_removed(tmp_path):
    (tmp_path / ".epoch-000002.tmp-shared").write_text("junk")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / ".epoch-000003.tmp-shared").symlink_to(tmp_path / "elsewhere")
    path, commit = _save(tmp_path, None)  # a whole state: Keras's weights file, committed
    assert commit is None and path.name == "epoch-000001"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere", "epoch-000001"]
    assert list((tmp_path / "elsewhere").iterdir()) == []  # a link is removed, not followed


@pytest.mark.slow
def test_a_relative_checkpoint_folder_saves_and_resumes(tmp_path):
    """Orbax refuses a relative path: --checkpoint-dir ck trained, then failed at its first
    save ("Checkpoint path should be absolute"), found by a hostile review."""
    args = [sys.executable, *WITHOUT_TF, *TRAIN, "--replicas", "2", "--shard", "all"]
    args += ["--checkpoint-dir", "ck", "--checkpoint-every", "16"]
    first = subprocess.run(  # the first of the two epochs (a later --epochs wins)
        [*args, "--epochs", "1"],
        capture_output=True,
        text=True,
        timeout=300,
        env=_env(),
        cwd=tmp_path,
    )
    assert first.returncode == 0, first.stderr[-3000:]
    assert (tmp_path / "ck" / "epoch-000001" / "state").is_dir()
    again = subprocess.run(
        args, capture_output=True, text=True, timeout=300, env=_env(), cwd=tmp_path
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert "ck/epoch-000001 (epoch 2, step 0)" in again.stderr, again.stderr[-3000:]
    assert again.stderr.count("resuming from") == 1, again.stderr[-3000:]
