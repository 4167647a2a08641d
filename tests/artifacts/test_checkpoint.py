"""checkpoint: step-exact resume after SIGTERM, crash-safe and durable writes, fallback past a
corrupt newest checkpoint, clear errors for corrupt or foreign checkpoints and for changed flags,
a full disk, and independence from the replica count. Mostly through real processes."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import keras
import numpy as np
import pytest

import tensorflow as tf

from conftest import ROOT, _env, fresh_env, run_cli, run_isolated

pytestmark = pytest.mark.slow
HERE = Path(__file__).parent

# The smallest model with Dropout (its RNG state must be checkpointed) and Adam (its slots).
RUN = [
    "train",
    "--model",
    "user_models:tiny_dropout",
    "--train-examples",
    "512",
    "--epochs",
    "3",
    "--global-batch-size",
    "32",
    "--steps-per-execution",
    "2",
    "--checkpoint-every",
    "8",
    "--optimizer",
    "adam",
    "--lr",
    "0.003",
    "--no-progress",
]


# Runs `mirrorfit train` several times in one fresh interpreter, each run's signal armed at a
# moment its patches name (cli_runs_driver.py). Each run's exit code and stderr.
def _spec(runs, patches, armed):
    return json.dumps({"runs": runs, "patches": patches, "armed": armed})


def _drive(runs, patches, armed, timeout=300):
    return run_isolated(HERE / "cli_runs_driver.py", _spec(runs, patches, armed), timeout=timeout)


def _weights(path):
    return keras.saving.load_model(path).get_weights()


def test_sigterm_then_resume_gives_the_uninterrupted_weights(tmp_path):
    a = [
        *RUN,
        "--checkpoint-dir",
        str(tmp_path / "a"),
        "--save-keras",
        str(tmp_path / "a.keras"),
        "--metrics-out",
        str(tmp_path / "a.json"),
    ]
    b = [
        *RUN,
        "--checkpoint-dir",
        str(tmp_path / "b"),
        "--save-keras",
        str(tmp_path / "b.keras"),
        "--export-dir",
        str(tmp_path / "models" / "m"),
    ]
    c = [
        *RUN,
        "--checkpoint-dir",
        str(tmp_path / "c"),
        "--save-keras",
        str(tmp_path / "c.keras"),
        "--metrics-out",
        str(tmp_path / "c.json"),
    ]
    # SIGTERM in epoch 2, at step 22 of 48: not on a --checkpoint-every boundary. And at step
    # 16, epoch 1's last: epoch 1 ends (its validation, line and checkpoint), then the run stops.
    ref, stopped, resumed, stopped_at_end, resumed_at_end = _drive(
        [a, b, b, c, c], {"at_steps": {}}, armed={1: "step 22", 3: "step 16"}
    )
    assert ref["code"] == 0, ref["err"][-3000:]
    assert stopped["code"] == 75, stopped["err"][-3000:]  # the documented preemption exit code
    assert "preempted by SIGTERM" in stopped["err"] and "rerun the same command" in stopped["err"]
    assert "epoch-000001-step-000006 at epoch 2, step 6" in stopped["err"]
    assert resumed["code"] == 0, resumed["err"][-3000:]
    assert "resuming from" in resumed["err"] and "(epoch 2, step 6)" in resumed["err"]
    assert sorted(os.listdir(tmp_path / "models" / "m")) == ["0001"]
    for wa, wb in zip(_weights(tmp_path / "a.keras"), _weights(tmp_path / "b.keras")):
        np.testing.assert_allclose(wa, wb, rtol=1e-5, atol=1e-6)

    assert stopped_at_end["code"] == 75, stopped_at_end["err"][-3000:]
    assert "epoch-000001 at epoch 2, step 0" in stopped_at_end["err"]
    assert resumed_at_end["code"] == 0, resumed_at_end["err"][-3000:]
    lines = [ln for ln in resumed_at_end["err"].splitlines() if ln.startswith("epoch ")]
    assert [ln.split(":")[0] for ln in lines] == ["epoch 2/3", "epoch 3/3"], lines
    want, got = (json.loads((tmp_path / f"{n}.json").read_text())["history"] for n in "ac")
    for key in ("loss", "accuracy", "val_loss", "val_accuracy"):  # this run's, as Keras's
        assert got[key] == pytest.approx(want[key][1:], rel=1e-5, abs=1e-6), key
    for wa, wc in zip(_weights(tmp_path / "a.keras"), _weights(tmp_path / "c.keras")):
        np.testing.assert_allclose(wa, wc, rtol=1e-5, atol=1e-6)


def test_a_signal_at_the_end_of_training_is_not_dropped(tmp_path):
    def run(name):
        return [
            *RUN,
            "--checkpoint-every",
            "0",
            "--checkpoint-dir",
            str(tmp_path / name / "c"),
            "--export-dir",
            str(tmp_path / name / "m"),
            "--save-keras",
            str(tmp_path / name / "k.keras"),
        ]

    moments = ("validation", "checkpoint")  # of the last epoch
    for name in moments:
        (tmp_path / name).mkdir()
    results = _drive(
        [run(m) for m in moments for _ in (0, 1)],
        {"last_validation": {}, "last_checkpoint": {}},
        armed={0: "validation", 2: "checkpoint"},
    )
    for name, stopped, rerun in zip(moments, results[::2], results[1::2]):
        assert stopped["code"] == 75, (name, stopped["err"][-3000:])
        assert "preempted by SIGTERM after training ended" in stopped["err"]
        assert "the last epoch is saved in" in stopped["err"]  # its checkpoint, complete
        assert sorted(p.name for p in (tmp_path / name / "c").iterdir())[-1] == "epoch-000003"
        assert "exported" not in stopped["err"]
        assert rerun["code"] == 0, rerun["err"][-3000:]  # the rerun finishes the job
        assert "nothing to train: 3 of 3 epochs already done" in rerun["err"]
        # One version: the stopped run added none (it would be 0001, the rerun's 0002).
        assert sorted(os.listdir(tmp_path / name / "m")) == ["0001"]
        assert (tmp_path / name / "k.keras").is_file()


def test_sigterm_without_a_checkpoint_dir_says_what_was_lost(tmp_path):
    cmd = [
        "train",
        "--model",
        "user_models:tiny",
        "--train-examples",
        "256",
        "--epochs",
        "100000",
        "--export-dir",
        str(tmp_path / "m"),
        "--no-progress",
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "mirrorfit.cli", *cmd],
        env=_env(),
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
    )
    for line in proc.stderr:  # training has started
        if line.startswith("epoch 1/"):
            break
    proc.send_signal(signal.SIGTERM)
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 75, err[-3000:]
    assert "nothing saved (no --checkpoint-dir)" in err and "Traceback" not in err
    assert not (tmp_path / "m").exists()


def _wait_for_handler(pid: int, signum: int, timeout_s: float = 60) -> None:
    """Until process ``pid`` catches ``signum`` (Linux's /proc/PID/status SigCgt mask): a fixed
    sleep raced the interpreter's start-up on a loaded machine (the signal came first: -15)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/status") as f:
            caught = next(int(ln.split()[1], 16) for ln in f if ln.startswith("SigCgt:"))
        if caught >> (signum - 1) & 1:
            return
        time.sleep(0.005)
    raise AssertionError(
        f"process {pid} installed no handler for signal {signum} in {timeout_s:g} s"
    )


def test_sigterm_while_tensorflow_loads_is_honoured(tmp_path):
    """The CLI takes the signals before it imports TensorFlow (seconds), not after."""
    cmd = [
        "train",
        "--model",
        "user_models:tiny",
        "--train-examples",
        "256",
        "--epochs",
        "1",
        "--export-dir",
        str(tmp_path / "m"),
        "--no-progress",
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "mirrorfit.cli", *cmd],
        env=fresh_env(),  # a new process: TensorFlow not loaded yet
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
    )
    _wait_for_handler(proc.pid, signal.SIGTERM)  # installed before TensorFlow loads (seconds)
    with open(f"/proc/{proc.pid}/maps") as f:
        assert "libtensorflow" not in f.read()  # TensorFlow's libraries not loaded yet
    proc.send_signal(signal.SIGTERM)
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 75, err[-3000:]  # not -15: killed before any handler
    assert "preempted by SIGTERM" in err and "Traceback" not in err
    assert not (tmp_path / "m").exists()


def test_a_second_ctrl_c_stops_at_once(tmp_path):
    run = [
        "train",
        "--model",
        "user_models:tiny",
        "--train-examples",
        "256",
        "--epochs",
        "2",
        "--global-batch-size",
        "32",
        "--steps-per-execution",
        "1",
        "--checkpoint-dir",
        str(tmp_path / "c"),
        "--no-progress",
    ]
    spec = _spec([run], {"at_step": {"step": 3, "sig": "SIGINT", "times": 2}}, {0: "step"})
    proc = subprocess.run(
        [sys.executable, str(HERE / "cli_runs_driver.py"), spec],
        env=_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == -signal.SIGINT, proc.stderr[-3000:]  # killed, not a clean exit
    assert "Ctrl-C again stops at once" in proc.stderr
    assert not list((tmp_path / "c").glob("epoch-*"))  # it did not go on to save


def _fit_save(folder: Path, mode: str, epochs: int) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(HERE / "fit_save_driver.py"), str(folder), mode, str(epochs)],
        env=fresh_env(),  # a fresh interpreter: the driver blocks TensorFlow
        capture_output=True,
        text=True,
        timeout=300,
    )


def _result(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_kill_9_during_a_save_leaves_the_previous_checkpoint_loadable(tmp_path):
    d = tmp_path / "ckpt"
    assert _result(_fit_save(d, "train", 1))["trained"] == [0]
    assert [p.name for p in d.iterdir() if not p.name.startswith(".lock")] == ["epoch-000001"]
    crashed = _fit_save(d, "crash", 2)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    assert any(p.name.startswith(".epoch-") for p in d.iterdir())  # half-written, not named
    after = _result(_fit_save(d, "train", 2))
    assert after == {"trained": [1], "warnings": [], "synced": [], "finite": True}
    assert not any(p.name.startswith(".epoch-") for p in d.iterdir())  # the dead writer's


def test_corrupt_checkpoint_is_named_and_fresh_starts_over(tmp_path):
    d = tmp_path / "ckpt"
    args = [
        "train",
        "--model",
        "user_models:tiny",
        "--train-examples",
        "256",
        "--epochs",
        "1",
        "--checkpoint-dir",
        str(d),
        "--no-progress",
    ]
    assert run_cli(*args).returncode == 0
    weights = d / "epoch-000001" / "state.weights.h5"
    damaged = bytearray(weights.read_bytes())
    damaged[-200:-100] = bytes(100)
    weights.write_bytes(bytes(damaged))
    bad = run_cli(*args, "--epochs", "2")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "epoch-000001 cannot be read" in bad.stderr and "--fresh" in bad.stderr
    assert "checkpoint_dir" not in bad.stderr  # the CLI's words: --checkpoint-dir
    fresh = run_cli(*args, "--epochs", "2", "--fresh")
    assert fresh.returncode == 0, fresh.stderr[-2000:]
    assert "moved the existing checkpoints" in fresh.stderr
    assert (d / "epoch-000002").is_dir()


def test_checkpoint_of_another_model_is_refused_clearly(tmp_path):
    d = tmp_path / "ckpt"
    assert (
        run_cli(
            "train",
            "--train-examples",
            "256",
            "--epochs",
            "1",
            "--checkpoint-dir",
            str(d),
            "--no-progress",
        ).returncode
        == 0
    )
    other = run_cli(
        "train",
        "--model",
        "user_models:tiny",
        "--train-examples",
        "256",
        "--epochs",
        "2",
        "--checkpoint-dir",
        str(d),
        "--no-progress",
    )
    assert other.returncode == 2
    assert (
        "written with --model mlp, this run has --model user_models:tiny: resume with "
        "--model mlp, or pass --fresh"
    ) in other.stderr
    wider = run_cli(
        "train",
        "--num-classes",
        "12",
        "--train-examples",
        "256",
        "--epochs",
        "2",
        "--checkpoint-dir",
        str(d),
        "--no-progress",
    )
    assert wider.returncode == 2  # names the weight that differs
    assert (
        "epoch-000001 holds another model's checkpoint (a weight of (100, 10) float32 where "
        "this model has (100, 12) float32); pass --fresh (or give another --checkpoint-dir)"
    ) in wider.stderr, wider.stderr[-2000:]


# -- resuming with changed flags (issue 10, item 8); 2 replicas resume on 1 -------------------
def test_changed_flags_resume_exactly_or_are_refused_by_name(tmp_path):
    base = [
        "train",
        "--model",
        "user_models:tiny",
        "--train-examples",
        "256",
        "--optimizer",
        "adam",
        "--lr",
        "0.003",
        "--no-progress",
    ]
    c = ["--checkpoint-dir", str(tmp_path / "c")]
    # flags of the rerun -> what the one line must say (default --batch-size 32): refused at
    # an epoch's end too, where Keras's BackupAndRestore would train on with other batches
    was_64 = "written with --global-batch-size 64, this run has --global-batch-size"
    refused = {
        ("--replicas", "1"): f"{was_64} 32: resume with --global-batch-size 64",
        ("--replicas", "2", "--accum-steps", "2"): f"{was_64} 128",
        ("--replicas", "2", "--batch-size", "16"): f"{was_64} 32",
        ("--replicas", "2", "--seed", "7"): "written with --seed 42, this run has --seed 7: "
        "resume with --seed 42",
        ("--replicas", "2", "--train-examples", "128"): "written with --train-examples 256, "
        "this run has --train-examples 128",
    }
    runs = [[*base, *c, "--replicas", "2", "--epochs", "1"]]  # global batch 2 x 32 = 64
    runs += [[*base, *c, "--epochs", "2", *flags] for flags in refused]
    # The same global batch another way: one replica, two accumulation steps of 32. Exact.
    runs.append(
        [
            *base,
            *c,
            "--epochs",
            "2",
            "--replicas",
            "1",
            "--accum-steps",
            "2",
            "--save-keras",
            str(tmp_path / "resumed.keras"),
        ]
    )
    # Once more, the global batch given directly: done already.
    runs.append([*base, *c, "--epochs", "2", "--replicas", "1", "--global-batch-size", "64"])
    runs.append(
        [
            *base,
            "--checkpoint-dir",
            str(tmp_path / "ref"),
            "--epochs",
            "2",
            "--replicas",
            "1",
            "--global-batch-size",
            "64",
            "--save-keras",
            str(tmp_path / "ref.keras"),
        ]
    )
    first, *results, resumed, again, ref = _drive(runs, {}, {})
    assert first["code"] == 0, first["err"][-3000:]
    for (flags, expected), got in zip(refused.items(), results):
        lines = [ln for ln in got["err"].splitlines() if ln.startswith("mirrorfit: error")]
        assert got["code"] == 2 and len(lines) == 1, (flags, got["err"][-3000:])
        assert expected in lines[0] and "--fresh" in lines[0], (flags, lines[0])
    assert resumed["code"] == 0, resumed["err"][-3000:]
    assert "resuming from" in resumed["err"] and "(epoch 2, step 0)" in resumed["err"]
    assert again["code"] == 0, again["err"][-3000:]
    assert "nothing to train: 2 of 2 epochs already done" in again["err"]
    assert ref["code"] == 0, ref["err"][-3000:]
    for a, b in zip(_weights(tmp_path / "ref.keras"), _weights(tmp_path / "resumed.keras")):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-5)  # as 1 vs 2 replicas


# -- a full disk (issue 10, item 10) ------------------------------------------------------------
def test_a_full_disk_says_so_and_keeps_the_previous_checkpoint(tmp_path):
    d = tmp_path / "c"
    run = [
        "train",
        "--model",
        "user_models:tiny",
        "--train-examples",
        "256",
        "--global-batch-size",
        "32",
        "--checkpoint-dir",
        str(d),
        "--no-progress",
    ]
    first, meta_full, tf_full = _drive(
        [[*run, "--epochs", "1"]] + [[*run, "--epochs", "2"]] * 2, {"disk_full": {}}, {}
    )
    assert first["code"] == 0, first["err"][-3000:]
    for got in (meta_full, tf_full):
        assert got["code"] == 2, got["err"][-3000:]
        assert "Traceback" not in got["err"] and "memory" not in got["err"]
        assert f"disk full while writing checkpoint {d}/epoch-000002" in got["err"]
        assert f"the previous checkpoint {d}/epoch-000001 is kept" in got["err"]
    assert [p.name for p in d.iterdir() if p.name != ".lock"] == ["epoch-000001"]  # no temp


def test_out_of_memory_hint_tells_a_full_disk_from_out_of_memory():
    from mirrorfit.errors import StorageError
    from mirrorfit.job.observe import out_of_memory_hint

    with pytest.raises(StorageError, match="disk full"):
        with out_of_memory_hint(32):
            raise tf.errors.ResourceExhaustedError(None, None, "/x/f; No space left on device")
    with pytest.raises(Exception, match="out of memory at a batch of 32"):
        with out_of_memory_hint(32):
            raise tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor")


# -- durability (issue 10, item 11) --------------------------------------------------------------
def test_checkpoints_are_fsynced_before_the_rename(tmp_path):
    synced = _result(_fit_save(tmp_path, "fsync", 1))["synced"]
    path = tmp_path / "epoch-000001"
    temp = [p.rsplit("/", 1) for p in synced if "/.epoch-" in p and p.count("/.epoch-") == 1]
    files = {str(p.relative_to(path)) for p in path.rglob("*") if p.is_file()}
    assert {"meta.json", "state.weights.h5"} <= files <= {name for _, name in temp}
    assert synced[-1] == str(tmp_path)  # the folder, after the rename


def test_export_rebuilds_a_checkpoint_at_the_shape_and_classes_it_was_trained_with(tmp_path):
    """A model trained on other data (here 32x32x3, 5 classes, synthetic) is exported from its
    checkpoint at that shape, not the model's default (MNIST's 28x28, 10 classes)."""
    from conftest import run_cli

    ckpt, models = tmp_path / "ckpt", tmp_path / "models" / "small"
    proc = run_cli(
        "train",
        "--model",
        "cnn",
        "--data",
        "synthetic",
        "--input-shape",
        "32,32,3",
        "--num-classes",
        "5",
        "--epochs",
        "1",
        "--global-batch-size",
        "16",
        "--train-examples",
        "64",
        "--no-progress",
        "--checkpoint-dir",
        str(ckpt),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = run_cli("export", "--checkpoint-dir", str(ckpt), "--export-dir", str(models))
    assert proc.returncode == 0, proc.stderr[-3000:]
    meta = json.loads(sorted(ckpt.glob("epoch-*"))[-1].joinpath("meta.json").read_text())
    assert meta["built_in"] and meta["name"] == "cnn"
    assert meta["shapes"]["inputs"][0][1:] == [32, 32, 3]
    assert meta["shapes"]["outputs"][0][-1] == 5


@pytest.mark.parametrize(
    "special", ["state.weights.h5 as a FIFO", "meta.json -> /dev/zero", "meta.json of 2 MiB"]
)
def test_a_checkpoint_file_that_is_no_plain_file_is_set_aside_not_read(tmp_path, special):
    """Opening a FIFO waits for a writer forever (a JAX state.npz as a FIFO hung the resume)
    and /dev/zero never ends: such a checkpoint is set aside, or refused in one line, before
    anything in it opens."""
    assert _result(_fit_save(tmp_path, "train", 2))["trained"] == [0, 1]
    newest = tmp_path / "epoch-000002"
    name = special.split()[0]
    (newest / name).unlink()
    if "FIFO" in special:
        os.mkfifo(newest / name)
    elif "/dev/zero" in special:
        (newest / name).symlink_to("/dev/zero")
    else:
        (newest / name).write_text('{"pad": "' + "x" * (2 << 20) + '"}')
    resumed = _result(_fit_save(tmp_path, "train", 3))
    if "/dev/zero" in special:  # no meta.json file: no checkpoint, but a folder of its name
        assert resumed["refused"] == (
            f"checkpoint_dir={str(tmp_path)!r} holds epoch-000002, which is not a checkpoint "
            "(no meta.json); move it out, or give another checkpoint_dir"
        )
        return
    assert resumed["trained"] == [1, 2]  # from epoch-000001
    (said,) = resumed["warnings"]
    assert said.startswith(f"checkpoint {newest} cannot be read"), said
    assert ("is not a plain file" if "MiB" not in special else "over 1 MiB") in said
    assert "resuming from the previous one, epoch-000001" in said


def test_recorded_model_shapes_are_hints_within_bounds():
    """export rebuilds a compiled --model for the shapes fit's meta.json records; a hostile
    meta.json must not have a huge model built before the identity check refuses it."""
    from mirrorfit.artifacts.checkpoint_model import _plausible

    assert _plausible([[None, 28, 28]]) and _plausible([[32, 224, 224, 3]])
    assert _plausible([[None, 30000]], outputs=True)
    for hostile in (
        [[None, 100_000, 100_000]],  # a side past MAX_IMAGE_SIDE
        [[None, 8192, 8192, 8]],  # 2**29 values
        [[None, 1.5]],
        [[None, True]],
        [[None]],
        [[None, 28, 28], [None, 28, 28]],  # two inputs: not passed
        "(None, 28, 28)",
        None,
    ):
        assert not _plausible(hostile), hostile
    assert not _plausible([[None, 2_000_000]], outputs=True)  # past MAX_CLASSES


@pytest.mark.parametrize("command", ["export", "evaluate"])
def test_a_folder_of_both_loops_checkpoints_is_one_line_before_tensorflow(command, tmp_path):
    """A folder holding the earlier loop's ckpt-* beside mirrorfit.fit's epoch-*: which run is
    the newer cannot be told, so neither is read (on the one-loop branch's 6c5b388 export read
    the stale ckpt-*, exit 0)."""
    d = tmp_path / "mixed"
    (d / "ckpt-000000008").mkdir(parents=True)
    (d / "epoch-000001").mkdir()
    (d / "epoch-000001" / "meta.json").write_text("{}")
    target = ("--export-dir", str(tmp_path / "e")) if command == "export" else ()
    proc = run_cli(command, "--checkpoint-dir", str(d), *target, without_tensorflow=True)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.strip() == (
        f"mirrorfit: error: {d} holds checkpoints of two runs, ckpt-000000008 (the earlier "
        "loop's) and epoch-000001 (mirrorfit.fit's); move the run you do not mean to another "
        "folder"
    )
