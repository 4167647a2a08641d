"""mirrorfit train with a compiled --model function: trained as compiled, through
mirrorfit.fit (job/keras_job.py), on the data as given."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from conftest import keras_file_weights, run_cli

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("backend", ["jax", "tensorflow"])
def test_a_compiled_regression_trains_as_compiled(backend, tmp_path):
    out = tmp_path / "m.json"
    proc = run_cli(
        "train",
        "--backend",
        backend,
        "--replicas",
        "2",
        "--model",
        "keras_models:regression",
        "--data",
        "keras_models:regression_data",
        "--epochs",
        "3",
        "--global-batch-size",
        "64",
        "--no-progress",
        "--metrics-out",
        str(out),
        "--checkpoint-dir",
        str(tmp_path / "ck"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "loss: mse (the model's compile), optimizer: Adam 0.01, metrics: mae" in proc.stderr
    # mirrorfit.fit's checkpoints: every epoch, the three latest kept
    assert sorted(p.name for p in (tmp_path / "ck").glob("epoch-*")) == [
        f"epoch-00000{i}" for i in (1, 2, 3)
    ]
    assert "state: replicated" in proc.stderr  # what each device holds, as the loop says
    summary = json.loads(out.read_text())
    assert summary["shard"] == "none" and summary["state_bytes_per_device"] > 0
    assert summary["replicas"] == 2  # as mirrorfit's own loop reports it
    assert summary["train_examples_per_sec"] > 0  # as the built-in loop's (on main: absent)
    assert "examples/s steady, loss" in proc.stderr
    history = summary["history"]
    assert set(history) == {"loss", "mae", "val_loss", "val_mae"}
    assert history["loss"][-1] < history["loss"][0] / 2  # float targets, kept float


def test_a_compiled_model_built_for_the_datas_shape_trains_as_compiled(tmp_path):
    """A function with no defaults for input_shape/num_classes gets the data's and, compiled,
    trains as compiled: the same history as the same model with defaults (on main it trained
    as the built-in model, with SGD and the built-in loss, exit 0)."""
    histories = {}
    for fn in ("digits", "digits_for_the_data"):
        out = tmp_path / f"{fn}.json"
        proc = run_cli(
            "train",
            "--backend",
            "jax",
            "--model",
            f"keras_models:{fn}",
            "--epochs",
            "1",
            "--no-progress",
            "--metrics-out",
            str(out),
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "(trained through mirrorfit.fit)" in proc.stderr, proc.stderr[-3000:]
        assert "optimizer: Adam 0.001" in proc.stderr
        histories[fn] = json.loads(out.read_text())["history"]
    assert histories["digits_for_the_data"] == histories["digits"]
    assert histories["digits"]["accuracy"][0] > 0.8


def test_the_chapters_cnn_on_uint8_learns_with_its_state_split(mnist_dir, tmp_path):
    out = tmp_path / "m.json"
    proc = run_cli(
        "train",
        "--backend",
        "jax",
        "--model",
        "keras_models:chapter_cnn",
        "--replicas",
        "2",
        "--shard",
        "all",
        "--epochs",
        "1",
        "--no-progress",
        "--metrics-out",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (
        "state: the weights and the optimizer state (FSDP) split over 2 devices" in proc.stderr
        and "gathered layer by layer" in proc.stderr
    ), proc.stderr[-3000:]
    summary = json.loads(out.read_text())
    assert summary["test"]["accuracy"] > 0.9  # the built-in loop's /255 had left it at 0.116
    assert summary["shard"] == "all" and summary["state_bytes_per_device"] > 0


@pytest.mark.parametrize("backend", ["jax", "tensorflow"])  # TF entered one scope twice
def test_loss_and_callbacks_for_an_uncompiled_model(backend, tmp_path):
    out = tmp_path / "m.json"
    proc = run_cli(
        "train",
        "--backend",
        backend,
        "--model",
        "keras_models:uncompiled",
        "--data",
        "keras_models:regression_data",
        "--loss",
        "mse",
        "--metrics",
        "mae",
        "--optimizer",
        "adam",
        "--lr",
        "0.05",
        "--epochs",
        "3",
        "--callbacks",
        "keras_models:stop_after_one",
        "--no-progress",
        "--metrics-out",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "loss: mse (--loss), optimizer: Adam 0.05, metrics: mae" in proc.stderr
    assert len(json.loads(out.read_text())["history"]["loss"]) == 1  # the callback stopped it


def test_keep_fresh_train_examples_and_logdir_reach_a_compiled_model(tmp_path):
    """--keep-checkpoints, --fresh, --train-examples and --logdir were refused with a compiled
    --model ("not yet supported"); they reach mirrorfit.fit now."""
    ck, tb, out = tmp_path / "ck", tmp_path / "tb", tmp_path / "m.json"
    common = [
        "train",
        "--backend",
        "jax",
        "--model",
        "keras_models:regression",
        "--data",
        "keras_models:regression_data",
        "--global-batch-size",
        "50",
        "--no-progress",
        "--checkpoint-dir",
        str(ck),
        "--checkpoint-every",
        "2",
        "--keep-checkpoints",
        "2",
        "--steps-per-execution",
        "2",
    ]
    proc = run_cli(*common, "--epochs", "2", "--train-examples", "200", "--logdir", str(tb))
    assert proc.returncode == 0, proc.stderr[-3000:]
    # 200 examples are 4 steps an epoch: step 2 of each, and each end; the 2 latest kept
    assert sorted(p.name for p in ck.glob("epoch-*")) == [
        "epoch-000001-step-000002",
        "epoch-000002",
    ]
    # the built-in loop's scalars: each call's (2 steps) and each epoch's, examples/s too
    # (on 1c298fd: epoch/ only)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tb), size_guidance={"tensors": 0})
    events.Reload()
    tags = set(events.Tags()["tensors"])
    assert {
        "train/loss",
        "train/mae",
        "train/learning_rate",
        "train/examples_per_sec",
        "epoch/val_loss",
        "epoch/examples_per_sec",
    } <= tags, tags
    assert [e.step for e in events.Tensors("train/loss")] == [2, 4, 6, 8]
    assert len(events.Tensors("train/examples_per_sec")) == 3  # none from the compiling call
    proc = run_cli(*common, "--epochs", "1", "--fresh", "--metrics-out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(json.loads(out.read_text())["history"]["loss"]) == 1  # started over
    (aside,) = ck.glob("discarded-*")
    assert sorted(p.name for p in aside.iterdir()) == ["epoch-000001-step-000002", "epoch-000002"]
    assert f"moved the existing checkpoints to {aside}, starting over" in proc.stderr


@pytest.mark.parametrize(
    "args, needle",
    [
        (("--warmup-epochs", "1"), "give a schedule with a warm-up there"),
        # the function's own validation split: --validation-split was dropped unsaid (0c1c184)
        (
            ("--validation-split", "0.1"),
            "--data keras_models:regression_data has its own validation split; drop "
            "--validation-split",
        ),
        (
            ("--export-dir", "{tmp}/e", "--export-preprocessing", "--backend", "tensorflow"),
            "--export-preprocessing does not apply to a compiled --model: the export takes",
        ),
    ],
)
def test_what_this_path_cannot_do_is_one_line(args, needle, tmp_path):
    args = [a.format(tmp=tmp_path) for a in args]
    proc = run_cli(
        "train",
        "--backend",
        "jax",
        "--model",
        "keras_models:regression",
        "--data",
        "keras_models:regression_data",
        *args,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert needle in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "args, needle",
    [
        (("--loss", "mse"), "--loss applies to a --model package.module:function"),
        (("--model", "keras_models:uncompiled", "--metrics", "mae"), "--metrics goes with --loss"),
        (
            ("--model", "keras_models:regression", "--callbacks", "nocolon"),
            "--callbacks 'nocolon': give package.module:function",
        ),
        (
            ("--model-parallel", "2", "--backend", "jax"),
            "--model-parallel 2 splits the weights of a compiled",
        ),
        (
            ("--model", "keras_models:regression", "--model-parallel", "2", "--backend")
            + ("tensorflow",),
            "--model-parallel 2 splits the weights over the devices on the JAX engine only",
        ),
        (("--model", "keras_models:regression", "--model-parallel", "0"), "--model-parallel"),
    ],
)
def test_bad_keras_flags_are_refused_before_tensorflow_loads(args, needle):
    proc = run_cli("train", *args, without_tensorflow=True)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert needle in proc.stderr


def test_xla_remat_and_export_reach_a_compiled_model(tmp_path):
    """--xla, --remat, --export-dir and --eval-batch-size were refused or dropped with a compiled
    --model; now each applies, and XLA and recomputation leave the result as it was."""
    import numpy as np

    runs = {}
    for name, extra in {
        "plain": (),
        "accelerated": ("--xla", "--remat", "--export-dir", str(tmp_path / "models" / "reg")),
    }.items():
        out = tmp_path / f"{name}.json"
        proc = run_cli(
            "train",
            "--backend",
            "tensorflow",
            "--replicas",
            "2",
            "--model",
            "keras_models:regression",
            "--data",
            "keras_models:regression_data",
            "--epochs",
            "2",
            "--global-batch-size",
            "64",
            "--eval-batch-size",
            "30",
            "--no-progress",
            "--metrics-out",
            str(out),
            *extra,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[name] = json.loads(out.read_text())
    plain, fast = runs["plain"], runs["accelerated"]
    assert (plain["xla"], fast["xla"]) == (False, True)
    assert (plain["remat_layers"], len(fast["remat_layers"])) == ([], 2)  # both Dense layers
    for key, values in plain["history"].items():
        np.testing.assert_allclose(fast["history"][key], values, rtol=1e-4, err_msg=key)
    # the model's own signature, versioned, served as TF Serving serves it
    import tensorflow as tf

    assert fast["export_path"].endswith("0001")
    loaded = tf.saved_model.load(fast["export_path"])
    (spec,) = loaded.signatures["serving_default"].structured_input_signature[1].values()
    assert spec.shape.as_list() == [None, 8] and spec.dtype == tf.float32


def test_flags_compile_an_uncompiled_model_with_scaling_and_warmup(tmp_path):
    """An uncompiled --model gets the built-in model's optimizer: --lr-scaling and
    --warmup-epochs were dropped silently (the rate was --lr, flat)."""
    proc = run_cli(
        "train",
        "--backend",
        "jax",
        "--model",
        "keras_models:uncompiled",
        "--data",
        "keras_models:regression_data",
        "--loss",
        "mse",
        "--lr",
        "0.01",
        "--lr-scaling",
        "linear",
        "--base-batch",
        "32",
        "--global-batch-size",
        "64",
        "--warmup-epochs",
        "1",
        "--epochs",
        "2",
        "--no-progress",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # 400 examples in batches of 64: 7 steps an epoch; from 0.01 to 0.01 x 64/32
    assert "optimizer: SGD 0.01 -> 0.02 over 7 warm-up steps" in proc.stderr


def _weights(keras_file) -> dict:
    """Every array of a saved .keras file's weights, by its path in the file."""
    import io
    import zipfile

    import h5py

    out: dict = {}
    with zipfile.ZipFile(keras_file) as z, h5py.File(io.BytesIO(z.read("model.weights.h5"))) as f:

        def keep(name, obj):  # returns None: h5py walks on
            if isinstance(obj, h5py.Dataset):
                out[name] = obj[()]

        f.visititems(keep)
    return out


def test_a_killed_sharded_bf16_accumulating_run_resumes_to_the_uninterrupted_one(
    mnist_dir, tmp_path
):
    """A compiled model (Adam) with --shard all --accum-steps 2 --precision bf16
    --checkpoint-every 10, killed (SIGKILL: no save of its own) in its second epoch and run
    again, ends with the weights of a run never stopped, bit for bit."""
    common = [
        "train",
        "--backend",
        "jax",
        "--replicas",
        "2",
        "--model",
        "keras_models:digits",
        "--data-dir",
        str(mnist_dir),
        "--train-examples",
        "1280",
        "--global-batch-size",
        "64",
        "--epochs",
        "2",
        "--shard",
        "all",
        "--accum-steps",
        "2",
        "--precision",
        "bf16",
        "--steps-per-execution",
        "5",
        "--checkpoint-every",
        "10",
        "--no-progress",
    ]
    whole = run_cli(
        *common,
        "--checkpoint-dir",
        str(tmp_path / "whole"),
        "--save-keras",
        str(tmp_path / "whole.keras"),
    )
    assert whole.returncode == 0, whole.stderr[-3000:]
    ck = ["--checkpoint-dir", str(tmp_path / "ck")]
    killed = run_cli(*common, *ck, "--callbacks", "keras_models:killed_in_epoch_two")
    assert killed.returncode == -9, killed.stderr[-3000:]
    # epoch 1's steps 10 and 20 (its end), then step 10 of epoch 2; killed after step 15
    assert sorted(p.name for p in (tmp_path / "ck").glob("epoch-*")) == [
        "epoch-000000-step-000010",
        "epoch-000001",
        "epoch-000001-step-000010",
    ]
    resumed = run_cli(*common, *ck, "--save-keras", str(tmp_path / "resumed.keras"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "epoch-000001-step-000010" in resumed.stderr  # where it resumed, said
    expected, got = _weights(tmp_path / "whole.keras"), _weights(tmp_path / "resumed.keras")
    # the Dense kernel and bias, and Adam's step count, rate and moments
    assert set(got) == set(expected) and len(expected) == 8
    assert expected["optimizer/vars/0"] == 40  # 2 epochs of 20 steps
    for name, value in expected.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)


def test_an_uncompiled_model_on_an_npz_without_validation_compiles_from_flags(tmp_path):
    """The warm-up's step count read --validation-split, None when not given: a TypeError."""
    rng = np.random.default_rng(0)
    data = tmp_path / "d.npz"
    np.savez(
        data, x_train=rng.normal(size=(64, 8)).astype("float32"), y_train=rng.normal(size=(64, 1))
    )
    proc = run_cli(
        "train",
        "--backend",
        "jax",
        "--model",
        "keras_models:uncompiled",
        "--loss",
        "mse",
        "--data",
        str(data),
        "--epochs",
        "1",
        "--no-progress",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_a_compiled_model_trains_on_two_workers(tmp_path):
    out, saved = tmp_path / "m.json", tmp_path / "r.keras"
    proc = run_cli(
        "launch",
        "--workers",
        "2",
        "--",
        sys.executable,
        "-m",
        "mirrorfit.cli",
        "train",
        "--backend",
        "jax",
        "--strategy",
        "multi-worker",
        "--model",
        "keras_models:regression",
        "--data",
        "keras_models:regression_data",
        "--epochs",
        "2",
        "--global-batch-size",
        "64",
        "--no-progress",
        "--metrics-out",
        str(out),
        "--save-keras",
        str(saved),
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    said = proc.stdout + proc.stderr
    assert "in 2 processes" in said and "loss: mse (the model's compile)" in said
    summary = json.loads(out.read_text())
    assert summary["replicas"] == 2 and len(summary["history"]["loss"]) == 2
    assert summary["history"]["loss"][1] < summary["history"]["loss"][0]
    assert saved.stat().st_size > 0


@pytest.mark.parametrize("backend", ["jax", "tensorflow"])
def test_data_the_model_cannot_take_is_one_line(backend, mnist_dir):
    """The regression model takes 8 numbers; MNIST's images are 28 x 28: Keras's
    ValueError traceback, now one line naming both shapes (a hostile review's finding)."""
    proc = run_cli("train", "--backend", backend, "--model", "keras_models:regression")
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = [ln for ln in proc.stderr.splitlines() if "error" in ln]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert lines[0].startswith(
        "mirrorfit: error: the training data has examples of shape (28, 28) but the model "
        "takes (8,)"
    ), lines[0]


@pytest.mark.parametrize("backend", ["jax", "tensorflow"])
@pytest.mark.parametrize(
    "model, needle",
    [
        ("two_outputs", "the model has 2 outputs and the training data one target array"),
        ("for_32x32", "the training data has examples of shape (28, 28) but the model takes"),
        ("mse_on_labels", "has targets of shape () per example and the model's output (10,)"),
    ],
)
def test_a_compiled_model_the_data_cannot_feed_is_one_line(backend, model, needle, mnist_dir):
    """On main each was a Keras or JAX traceback, exit 1 (issue 49)."""
    proc = run_cli(
        "train", "--backend", backend, "--model", f"keras_models:{model}", "--no-progress"
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("mirrorfit: error: ") and needle in last, last
    assert "Traceback" not in proc.stderr


def test_sync_batchnorm_reaches_a_compiled_model(tmp_path):
    """--sync-batchnorm: 2 replicas train the BatchNormalization model as one replica does
    (on main the flag did not exist, and each replica normalized over its own half); without
    it the start screen warns. (One replica without the flag is not the reference: the
    partial last batch's padding enters its statistics, which the flag leaves out.) Where it
    cannot apply, one line, exit 2."""
    common = ("train", "--backend", "jax", "--model", "keras_models:normalized")
    common += ("--data", "keras_models:regression_data", "--epochs", "2", "--no-progress")
    common += ("--global-batch-size", "64")
    histories, stderr = {}, {}
    for name, extra in {
        "one": ("--replicas", "1", "--sync-batchnorm"),  # the partial batch's padding left out
        "synced": ("--replicas", "2", "--sync-batchnorm"),
        "per-replica": ("--replicas", "2"),
    }.items():
        out = tmp_path / f"{name}.json"
        proc = run_cli(*common, *extra, "--metrics-out", str(out))
        assert proc.returncode == 0, proc.stderr[-3000:]
        histories[name], stderr[name] = json.loads(out.read_text())["history"], proc.stderr
    np.testing.assert_allclose(histories["synced"]["loss"], histories["one"]["loss"], rtol=1e-5)
    assert abs(histories["per-replica"]["loss"][-1] - histories["one"]["loss"][-1]) > 1e-4
    assert "sync_batchnorm=True) (mirrorfit train --sync-batchnorm)" in stderr["per-replica"]
    assert "--sync-batchnorm" not in stderr["synced"] + stderr["one"]
    for args, needle in (
        (
            ("--model", "keras_models:normalized", "--backend", "tensorflow", "--xla"),
            "sync_batchnorm with jit_compile=True: on TensorFlow",
        ),
    ):
        proc = run_cli(
            "train",
            *args,
            "--data",
            "keras_models:regression_data",
            "--sync-batchnorm",
            "--replicas",
            "2",
        )
        assert proc.returncode == 2, proc.stderr[-3000:]
        assert needle in proc.stderr and "Traceback" not in proc.stderr


def test_model_parallel_trains_a_compiled_model_on_a_2d_mesh(tmp_path):
    """--model-parallel 2 --shard all on 4 devices: the compiled model on a 2 x 2 mesh (each
    weight split over a model group and the data groups), the history of the data-parallel
    run to float rounding (on main: no such flag)."""
    runs = {}
    for name, extra in (
        ("flat", ()),
        ("grid", ("--model-parallel", "2", "--shard", "all")),
        ("zero", ("--model-parallel", "2", "--shard", "optimizer")),
    ):
        out = tmp_path / f"{name}.json"
        proc = run_cli(
            "train",
            "--backend",
            "jax",
            "--replicas",
            "4",
            "--model",
            "keras_models:digits",
            "--train-examples",
            "1024",
            "--epochs",
            "2",
            "--no-progress",
            "--metrics-out",
            str(out),
            *extra,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[name] = (proc.stderr, json.loads(out.read_text()))
    stderr, grid = runs["grid"]
    assert "state: a 2-D mesh: each weight split over the 2 devices of a model group" in stderr
    assert "the weights and optimizer state split over the data groups too" in stderr
    flat, zero = runs["flat"][1], runs["zero"][1]
    assert (flat["model_parallel"], grid["model_parallel"]) == (1, 2)
    assert "the optimizer state split over the data groups too" in runs["zero"][0]
    # Adam: the kernel split in 4 under all; in 2 and its two slots in 4 under optimizer
    # (what the flag printed before the slots followed it from the command line: the slots
    # in 2 alike, 0.5x)
    assert grid["state_bytes_per_device"] < zero["state_bytes_per_device"]
    assert zero["state_bytes_per_device"] < 0.4 * flat["state_bytes_per_device"]
    for run in (grid, zero):
        for key, values in flat["history"].items():
            np.testing.assert_allclose(run["history"][key], values, rtol=1e-4, err_msg=key)


def _trained(tmp_path, name, *args):
    out = tmp_path / f"{name}.json"
    proc = run_cli(
        "train",
        "--backend",
        "jax",
        "--model",
        "keras_models:digits_for_the_data",
        "--epochs",
        "2",
        "--global-batch-size",
        "50",
        "--no-progress",
        "--metrics-out",
        str(out),
        *args,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "(trained through mirrorfit.fit)" in proc.stderr, proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_image_folders_and_tfrecords_reach_a_compiled_model_as_their_arrays(tmp_path):
    """An image folder (train/ and test/) and TFRecords of real MNIST digits, given to a
    compiled --model, train as the same pixels saved in an .npz in the source's order: the
    same history and test figures (on main: "--data ... is not yet supported with a
    compiled --model", exit 2). --cache FOLDER keeps the decoded images there."""
    from data_fixtures import folder_order, mnist, write_png_folder, write_tfrecords

    x, y = mnist(600)
    tx, ty = mnist(200, split="test")
    write_png_folder(tmp_path / "digits" / "train", x, y)
    write_png_folder(tmp_path / "digits" / "test", tx, ty)
    order, test_order = folder_order(y), folder_order(ty)
    np.savez(
        tmp_path / "folder.npz",
        x_train=x[order][..., None],
        y_train=y[order],
        x_test=tx[test_order][..., None],
        y_test=ty[test_order],
    )
    cache = tmp_path / "cache"
    folder = _trained(tmp_path, "folder", "--data", str(tmp_path / "digits"), "--cache", str(cache))
    arrays = _trained(tmp_path, "folder-npz", "--data", str(tmp_path / "folder.npz"))
    assert folder["history"] == arrays["history"]
    assert folder["test"] == arrays["test"]
    assert folder["history"]["accuracy"][-1] > 0.5  # it learns: the pixels are the digits'
    assert len(list(cache.glob("mirrorfit-cache-*.npy"))) == 2  # train/ and test/

    write_tfrecords(tmp_path / "records", x, y, 2)
    records_order = np.concatenate([np.arange(0, 600, 2), np.arange(1, 600, 2)])
    np.savez(
        tmp_path / "records.npz", x_train=x[records_order][..., None], y_train=y[records_order]
    )
    pattern = str(tmp_path / "records" / "train-*.tfrecord")
    records = _trained(tmp_path, "records", "--data", pattern)
    arrays = _trained(tmp_path, "records-npz", "--data", str(tmp_path / "records.npz"))
    assert records["history"] == arrays["history"]
    # --validation-split: the reader holds out its seeded share, scored every epoch
    held = _trained(tmp_path, "held", "--data", pattern, "--validation-split", "0.2")
    assert len(held["history"]["val_loss"]) == 2


@pytest.mark.parametrize(
    "model, needle",
    [
        (
            "rgb_32x32",
            "the --model takes examples of shape (32, 32, 3); --data {data}'s images are "
            "(28, 28, 1): --image-size 32,32 resizes the images; they decode to 1 channel(s): "
            "give images of the model's channels, or a model built for theirs",
        ),
        (
            "digits",  # Input((28, 28)): the same values without the channel axis
            "the --model takes examples of shape (28, 28); --data {data}'s images are "
            "(28, 28, 1): take keras.Input((28, 28, 1)) in the model, then "
            "keras.layers.Reshape((28, 28)) (or Flatten)",
        ),
        (
            "two_image_inputs",
            "--data {data} gives one image per example; the --model takes 2 inputs: give the "
            "inputs as an .npz",
        ),
    ],
)
def test_images_a_compiled_model_cannot_take_are_one_line(model, needle, tmp_path):
    """A model for 32x32 RGB, or of two inputs, on a folder of 28x28 grayscale digits: one
    line naming what fits, before any image is decoded (on 078ee79 the RGB model's line told
    to drop an --input-shape never given, and the two inputs were a traceback, exit 1)."""
    from data_fixtures import mnist, write_png_folder

    data = tmp_path / "digits"
    write_png_folder(data, *mnist(60))
    proc = run_cli(
        "train", "--backend", "jax", "--model", f"keras_models:{model}", "--data", str(data)
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert needle.format(data=data) in proc.stderr and "Traceback" not in proc.stderr


def test_a_model_of_two_inputs_on_one_array_of_images_is_one_line(mnist_dir):
    """MNIST's one image per example for a model of two inputs (on main: Keras's ValueError
    from the build as a traceback, exit 1)."""
    proc = run_cli(
        *("train", "--backend", "jax", "--model", "keras_models:two_image_inputs"),
        *("--data-dir", str(mnist_dir), "--train-examples", "256"),
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "the model has 2 inputs (input_layer, input_layer_1) and the training data one " in (
        proc.stderr
    )
    assert "Traceback" not in proc.stderr


def test_synthetic_data_reaches_a_compiled_model_in_its_input_shape(tmp_path):
    """--data synthetic: random uint8 images of the model's input shape and labels of its
    classes, --train-examples of them (on main: "not yet supported", exit 2)."""
    got = _trained(tmp_path, "synthetic", "--data", "synthetic", "--train-examples", "300")
    assert len(got["history"]["loss"]) == 2
    assert all(np.isfinite(got["history"]["loss"]))


def _npz_cases(folder) -> dict[str, str]:
    """.npz files a compiled --model cannot train or be scored on, and what each says."""
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 256, (300, 28, 28), dtype=np.uint8), rng.integers(0, 10, 300)
    cases = {
        "no_y_test": (dict(x_test=x[:50]), "its test split: no labels (y), but the model"),
        "rows_differ": (
            dict(x_test=x[:50], y_test=y[:40]),
            "its test split: the arrays have different numbers of rows (x 50, y 40)",
        ),
        "string_labels": (
            dict(x_test=x[:50], y_test=y[:50].astype(str)),
            "its test split: y holds strings (dtype <U21)",
        ),
        "complex_train": (
            dict(x_train=x.astype(np.complex64)),
            "its train split: x holds complex numbers (dtype complex64), which Keras would cast",
        ),
        # on d64421a this weight was read as the labels
        "weights_without_labels": (
            dict(y_train=None, sample_weight_train=np.ones(300)),
            "its train split: no labels (y), but the model is compiled with a loss",
        ),
    }
    needles = {}
    for name, (arrays, needle) in cases.items():
        members = {"x_train": x, "y_train": y, **arrays}
        np.savez(folder / f"{name}.npz", **{k: v for k, v in members.items() if v is not None})
        needles[name] = needle
    return needles


@pytest.mark.parametrize("backend", ["jax", "tensorflow"])
def test_npz_splits_a_compiled_model_cannot_take_are_one_line_before_training(backend, tmp_path):
    """Each split is checked before anything trains: on d64421a a test split without labels,
    of rows that disagree or of strings was a traceback after the whole training, complex
    pixels were cast to their real part without a word, and a sample_weight_train beside no
    y_train trained as the labels."""
    for name, needle in _npz_cases(tmp_path).items():
        proc = run_cli(
            *("train", "--backend", backend, "--model", "keras_models:digits"),
            *("--data", str(tmp_path / f"{name}.npz"), "--epochs", "1", "--no-progress"),
        )
        assert proc.returncode == 2, (name, proc.stderr[-3000:])
        last = proc.stderr.strip().splitlines()[-1]
        assert (
            last.startswith(f"mirrorfit: error: --data {tmp_path / name}.npz, ") and needle in last
        ), last
        assert "Traceback" not in proc.stderr and "done:" not in proc.stdout, name


def test_evaluate_refuses_npz_test_splits_it_cannot_score_in_one_line(tmp_path, mnist_dir):
    d = tmp_path / "ckpt"
    trained = run_cli(
        *("train", "--backend", "jax", "--model", "keras_models:digits"),
        *("--data-dir", str(mnist_dir), "--train-examples", "128", "--epochs", "1"),
        *("--checkpoint-dir", str(d), "--no-progress"),
    )
    assert trained.returncode == 0, trained.stderr[-3000:]
    needles = _npz_cases(tmp_path)
    for name in ("no_y_test", "rows_differ", "string_labels"):
        proc = run_cli(
            *("evaluate", "--checkpoint-dir", str(d), "--model", "keras_models:digits"),
            *("--data", str(tmp_path / f"{name}.npz")),
        )
        assert proc.returncode == 2, (name, proc.stderr[-3000:])
        last = proc.stderr.strip().splitlines()[-1]
        assert needles[name] in last and "Traceback" not in proc.stderr, last


def _central_or_mirrored(tmp_path, strategy: str, model: str, *args: str):
    out = tmp_path / strategy
    out.mkdir()
    proc = run_cli(
        "train",
        *args,
        "--backend",
        "tensorflow",
        "--model",
        model,
        "--strategy",
        strategy,
        "--replicas",
        "2",
        "--epochs",
        "1",
        "--train-examples",
        "2000",
        "--batch-size",
        "64",
        "--no-progress",
        "--metrics-out",
        str(out / "m.json"),
        "--save-keras",
        str(out / "m.keras"),
    )
    return proc, out


def test_central_storage_trains_a_compiled_model_as_mirrored_does(tmp_path):
    """One copy of each variable, Keras's metric increments made one op each: the weights and
    every figure of the mirrored run (before, each metric was summed over the replicas)."""
    runs = {}
    for strategy in ("mirrored", "central-storage"):
        proc, out = _central_or_mirrored(tmp_path, strategy, "user_models:compiled_counted")
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[strategy] = (
            json.loads((out / "m.json").read_text()),
            keras_file_weights(out / "m.keras"),
        )
    (mirrored, w1), (central, w2) = runs["mirrored"], runs["central-storage"]
    assert central["strategy"] == "CentralStorageStrategy"
    for key in ("final_train_loss", "final_train_accuracy", "val_accuracy", "test_accuracy"):
        assert central[key] == pytest.approx(mirrored[key], rel=1e-6), key
    # a metric of the user's own that only adds (a Mean's update_state of its own): not
    # refused (a check by class refused it), and the same
    for key in ("confidence", "val_confidence"):
        assert central["history"][key] == pytest.approx(mirrored["history"][key], rel=1e-6)
    for a, b in zip(w1, w2):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(
    "model, args, needle",
    [
        ("compiled_iou", (), "the metric mean_io_u (MeanIoU) updates its state with an assign"),
        ("compiled_adam", (), "seed_generator_state: under central storage the step's replicas"),
        ("compiled_batchnorm", (), "moving_mean: under central storage the step's replicas"),
        ("compiled_counted", ("--precision", "fp16"), "fp16's loss scaling under central"),
        (
            "compiled_two_outputs",
            ("--data", "user_models:two_targets"),
            "a model of several outputs (a, b) under central storage",
        ),
    ],
)
def test_central_storage_refuses_what_one_shared_copy_breaks(model, args, needle, tmp_path):
    """Each was a traceback (exit 1) or, for two outputs, per-output losses off (1.72711 for
    mirrored's 1.72591)."""
    proc, _ = _central_or_mirrored(tmp_path, "central-storage", f"user_models:{model}", *args)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert needle in proc.stderr and "Traceback" not in proc.stderr


def test_central_storage_trains_a_jit_compiled_model_without_xla_and_says_so(tmp_path):
    """Was an InvalidArgumentError traceback: XLA cannot reach the one copy's device."""
    proc, out = _central_or_mirrored(tmp_path, "central-storage", "user_models:compiled_jit")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "is compiled with jit_compile (or --xla): off under central storage" in proc.stderr
    assert json.loads((out / "m.json").read_text())["xla"] is False


def test_central_storage_on_one_replica_refuses_nothing_of_that(tmp_path):
    """One replica writes its one copy alone: an assigning metric trains, as it did before
    the watch for them (which refused it here for a while)."""
    out = tmp_path / "one"
    out.mkdir()
    proc = run_cli(
        "train",
        *("--backend", "tensorflow", "--model", "user_models:compiled_iou"),
        *("--strategy", "central-storage", "--replicas", "1", "--epochs", "1"),
        *("--train-examples", "1000", "--no-progress", "--metrics-out", str(out / "m.json")),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((out / "m.json").read_text())["history"]["mean_io_u"][0] > 0


@pytest.mark.parametrize("backend", ["jax", "tensorflow"])
def test_an_fp16_compiled_model_reports_its_loss_scale_and_skipped_steps(
    backend, mnist_dir, tmp_path
):
    """--metrics-out's skipped_steps was null for a compiled --model (Keras's loss scaling
    counts only the applied steps): now the steps trained less those applied, with the loss
    scale, and each epoch's line says both, after its examples/s."""
    m = tmp_path / "m.json"
    proc = run_cli(
        *("train", "--backend", backend, "--model", "keras_models:compiled_mlp"),
        *("--data-dir", str(mnist_dir), "--precision", "fp16", "--train-examples", "640"),
        *("--epochs", "2", "--no-progress", "--metrics-out", str(m)),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(m.read_text())
    assert summary["loss_scale"] > 0 and isinstance(summary["skipped_steps"], int)
    # Keras starts the scale at 2**15: the first steps' gradients overflow in fp16
    assert summary["steps"] + summary["skipped_steps"] == 2 * 640 // 32, summary
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("epoch ")]
    assert len(lines) == 2 and all(" examples/s loss scale " in ln for ln in lines), lines
    assert (
        lines[-1]
        .split(" loss scale ")[1]
        .split(",")[1]
        .strip()
        .startswith(f"{summary['skipped_steps']} skipped")
    ), lines


def test_a_compiled_models_optimizer_state_split_holds_less_than_replicated(tmp_path):
    """JAX, one process: fit's runner left the Keras variables whole on device 0 beside its
    own copy of the state, so --shard optimizer held more than --shard none (1,267,728
    against 954,128 bytes for this mlp with Adam on 2 devices); now the variables are the
    state."""
    held = {}
    for shard in ("none", "optimizer"):
        m = tmp_path / f"{shard}.json"
        proc = run_cli(
            *("train", "--backend", "jax", "--replicas", "2", "--shard", shard),
            *("--model", "keras_models:compiled_mlp", "--train-examples", "640"),
            *("--epochs", "1", "--no-progress", "--metrics-out", str(m)),
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        held[shard] = json.loads(m.read_text())["state_bytes_per_device"]
    # the weights whole on each device, Adam's two slots split over two: 2/3 of none's
    assert held["optimizer"] < 0.7 * held["none"], held


@pytest.mark.parametrize("backend", ["jax", "tensorflow"])
def test_a_data_functions_dataset_resumes_at_an_epoch_in_that_epochs_order(
    backend, tmp_path, monkeypatch
):
    """A --data function's dataset of single examples is shuffled with --seed, reshuffled each
    epoch; a run stopped after epoch 1 and resumed trains epoch 2 on the order the run never
    stopped drew for it, so it ends with the same weights (on 4a4c: epoch 1's order again)."""
    monkeypatch.setenv("DATA_FIXTURE_N", "640")
    common = [
        "train",
        "--backend",
        backend,
        "--model",
        "keras_models:digits",
        "--data",
        "data_fixtures:dataset_source",
        "--global-batch-size",
        "64",
        "--no-progress",
    ]
    whole = run_cli(
        *common,
        "--epochs",
        "2",
        "--checkpoint-dir",
        str(tmp_path / "whole"),
        "--save-keras",
        str(tmp_path / "whole.keras"),
    )
    assert whole.returncode == 0, whole.stderr[-3000:]
    ck = ["--checkpoint-dir", str(tmp_path / "ck")]
    first = run_cli(*common, *ck, "--epochs", "1")
    assert first.returncode == 0, first.stderr[-3000:]
    resumed = run_cli(*common, *ck, "--epochs", "2", "--save-keras", str(tmp_path / "r.keras"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    expected, got = _weights(tmp_path / "whole.keras"), _weights(tmp_path / "r.keras")
    assert set(got) == set(expected)
    for name, value in expected.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)


def test_a_validation_split_of_a_functions_own_batches_is_one_line(tmp_path):
    """--validation-split holds out examples: a --data function's training split in its own
    batches is refused in one line naming the way round, before anything trains (on d90347f:
    Keras's ValueError, a traceback, exit 1)."""
    proc = run_cli(
        *("train", "--backend", "jax", "--model", "keras_models:digits"),
        *("--data", "data_fixtures:drop_batched_source", "--validation-split", "0.1"),
        *("--checkpoint-dir", str(tmp_path / "ck")),
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        "mirrorfit: error: --validation-split 0.1 holds out examples; --data "
        "data_fixtures:drop_batched_source returns its training split in batches: return "
        "a validation split from the function too, or drop --validation-split"
    )
    assert not (tmp_path / "ck").exists()


@pytest.mark.parametrize("replicas", ["1", "2"])
def test_a_compiled_models_jax_step_compiles_once(replicas, monkeypatch):
    """The training call is compiled once for the run: on one device the first call's weights
    were arrays of their own and its result the mesh's, so the second call compiled the step
    again, inside the "steady" examples/s (on d90347f: 2 compiles, 16.6k against 287k
    examples/s steady on this host)."""
    monkeypatch.setenv("JAX_LOG_COMPILES", "1")
    proc = run_cli(
        "train",
        "--backend",
        "jax",
        "--replicas",
        replicas,
        "--model",
        "keras_models:digits",
        "--train-examples",
        "1280",
        "--global-batch-size",
        "64",
        "--epochs",
        "2",
        "--no-progress",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count("Compiling jit(_train_per_device)") == 1, proc.stderr[-3000:]


@pytest.mark.parametrize(
    "backend, source", [("jax", "sorted_arrays_source"), ("tensorflow", "sorted_dataset_source")]
)
def test_a_validation_split_is_drawn_with_the_seed(backend, source, tmp_path, monkeypatch):
    """--validation-split holds out examples drawn with --seed (docs/data.md), as the readers
    do, of arrays and of a dataset of examples: on data in label order Keras's last rows
    would be one class the model never trained on (on 0c1c184: val accuracy 0.0 for arrays;
    a dataset was refused)."""
    monkeypatch.setenv("DATA_FIXTURE_N", "2000")
    out = tmp_path / "m.json"
    proc = run_cli(
        *("train", "--backend", backend, "--model", "keras_models:digits"),
        *("--data", f"data_fixtures:{source}", "--validation-split", "0.2"),
        *("--global-batch-size", "32", "--epochs", "2", "--no-progress", "--metrics-out", str(out)),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    history = json.loads(out.read_text())["history"]
    assert history["val_accuracy"][-1] > 0.6, history
    assert abs(history["val_accuracy"][-1] - history["accuracy"][-1]) < 0.15, history


def test_train_examples_and_cache_reach_a_data_functions_dataset(tmp_path, monkeypatch):
    """--train-examples takes the first N of a --data function's dataset of examples and
    --cache keeps them in a folder, as the built-in loop reads one (on 43a9f36 both were
    refused for a compiled --model); what they cannot apply to is one line."""
    monkeypatch.setenv("DATA_FIXTURE_N", "640")
    cache = tmp_path / "cache"
    common = ["train", "--backend", "jax", "--model", "keras_models:digits", "--no-progress"]
    common += ["--global-batch-size", "64", "--epochs", "2"]
    proc = run_cli(
        *common,
        *("--data", "data_fixtures:dataset_source", "--train-examples", "300"),
        *("--cache", str(cache)),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "done: 10 steps" in proc.stderr  # 300 examples in batches of 64: 5 a epoch
    assert list(cache.glob("mirrorfit-*.index"))  # tf.data's cache files
    refused = {
        ("data_fixtures:dataset_source", "--train-examples", "1000"): (
            "--train-examples 1000 is more than the 640 training examples of --data "
            "data_fixtures:dataset_source"
        ),
        ("data_fixtures:batched_dataset_source", "--cache", str(cache)): (
            "--cache applies to a dataset of single examples; --data "
            "data_fixtures:batched_dataset_source returns its training split in batches: "
            "cache them in the function instead"
        ),
        ("data_fixtures:arrays_source", "--cache", str(cache)): (
            "--cache keeps a dataset's examples; --data data_fixtures:arrays_source returns "
            "arrays, which are in memory already: drop --cache"
        ),
    }
    for (data, *flags), line in refused.items():
        proc = run_cli(*common, "--data", data, *flags)
        assert proc.returncode == 2, proc.stderr[-3000:]
        assert proc.stderr.strip().splitlines()[-1] == f"mirrorfit: error: {line}"


def test_a_signal_after_training_stops_saying_where_a_rerun_resumes(tmp_path, monkeypatch):
    """SIGTERM while the test split is scored, after fit returned: exit 75 with a line that
    says training ended and where the rerun resumes, which trains nothing more and writes
    the results (on e47d169: "SIGTERM before training started", and the rerun said nothing of
    a resume)."""
    monkeypatch.setenv("DATA_FIXTURE_N", "256")
    monkeypatch.setenv("STOP_MARK", str(tmp_path / "stopped"))
    ck, out = tmp_path / "ck", tmp_path / "m.json"
    args = ["train", "--backend", "jax", "--model", "keras_models:digits", "--no-progress"]
    args += ["--data", "data_fixtures:test_read_stops_source", "--epochs", "1"]
    args += ["--checkpoint-dir", str(ck), "--metrics-out", str(out)]
    stopped = run_cli(*args)
    assert stopped.returncode == 75, stopped.stderr[-3000:]
    assert stopped.stderr.strip().splitlines()[-1] == (
        "mirrorfit: preempted by SIGTERM after training ended, before its results were "
        f"written: the last epoch is saved in {ck}; rerun the same command to write them (it "
        "resumes there and trains no more)"
    )
    assert not out.exists()
    again = run_cli(*args)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "epoch 1/1" not in again.stderr  # nothing trained again
    summary = json.loads(out.read_text())
    assert summary["steps_this_run"] == 0 and "accuracy" in summary["test"]


def test_a_built_in_models_data_function_is_called_once(tmp_path, monkeypatch):
    """The built-in models open --data to be built for it, and train through keras_job: the
    function's splits are read from the one call (on the branch's 6c5b388: called twice)."""
    monkeypatch.setenv("DATA_FIXTURE_N", "256")
    monkeypatch.setenv("CALLS", str(tmp_path / "calls"))
    proc = run_cli(
        *("train", "--backend", "jax", "--model", "mlp", "--epochs", "1", "--no-progress"),
        *("--data", "data_fixtures:counted_arrays_source"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "calls").read_text() == "1"


def _mnist_npz(path, mnist_dir, n: int, **as_type) -> None:
    """``n`` training and ``n // 4`` test images of the real MNIST, each split's x of the
    dtype ``as_type`` gives it (``x_test=np.float32``: scaled to [0, 1])."""
    with np.load(mnist_dir / "mnist.npz") as f:
        arrays = {
            "x_train": f["x_train"][:n],
            "y_train": f["y_train"][:n],
            "x_test": f["x_test"][: n // 4],
            "y_test": f["y_test"][: n // 4],
        }
    for key, dtype in as_type.items():
        arrays[key] = (arrays[key] / 255.0).astype(dtype)
    np.savez(path, **arrays)


def test_a_built_in_model_holds_out_rows_of_an_npz_without_weights(tmp_path, mnist_dir):
    """--validation-split on an .npz (no sample_weight_train): on the branch's 58affe8 a
    traceback (the weights' None indexed), as for a compiled model since the split was drawn."""
    _mnist_npz(tmp_path / "d.npz", mnist_dir, 1000)
    out = tmp_path / "m.json"
    proc = run_cli(
        *("train", "--data", str(tmp_path / "d.npz"), "--validation-split", "0.25"),
        *("--epochs", "1", "--no-progress", "--metrics-out", str(out)),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = json.loads(out.read_text())
    assert m["steps"] == -(-750 // 32) and len(m["history"]["val_loss"]) == 1, m["history"]


def test_a_built_in_model_refuses_splits_of_two_kinds_of_pixels(tmp_path, mnist_dir):
    """uint8 training pixels beside float [0, 1] test images: the model's Rescaling scaled
    the test images again (test accuracy 0.099, exit 0, on the branch's 58affe8)."""
    _mnist_npz(tmp_path / "mixed.npz", mnist_dir, 400, x_test=np.float32)
    proc = run_cli("train", "--data", str(tmp_path / "mixed.npz"), "--epochs", "1")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        f"mirrorfit: error: --data {tmp_path / 'mixed.npz'}: the training images are uint8 "
        "pixels and the test images not uint8; the model scales uint8 pixels to [0, 1] and "
        "takes other numbers as they are: give every split the same dtype"
    )


def test_a_built_in_models_keras_file_takes_images_in_0_1(tmp_path, mnist_dir):
    """Trained on uint8 pixels behind a Rescaling, its .keras file takes [0, 1] images as its
    export does (on the branch's 58affe8 it took uint8: [0, 1] images scored 0.10)."""
    import keras

    _mnist_npz(tmp_path / "d.npz", mnist_dir, 2000)
    out = tmp_path / "m.json"
    proc = run_cli(
        *("train", "--data", str(tmp_path / "d.npz"), "--epochs", "2", "--no-progress"),
        *("--save-keras", str(tmp_path / "m.keras"), "--metrics-out", str(out)),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    model = keras.saving.load_model(tmp_path / "m.keras", compile=False)
    assert model.inputs[0].dtype == "float32", model.inputs[0]
    with np.load(tmp_path / "d.npz") as f:
        x, y = f["x_test"] / np.float32(255), f["y_test"]
    accuracy = float(np.mean(np.argmax(model.predict(x, verbose=0), axis=-1) == y))
    assert abs(accuracy - json.loads(out.read_text())["test_accuracy"]) < 1e-6, accuracy


def test_fits_warnings_are_one_line_each_in_the_cli(tmp_path, mnist_dir):
    """mirrorfit.fit's warnings (a Python API's) printed with the file, line and source line
    Python adds (`keras_job.py:800: UserWarning: ...` and `warnings.warn(`); one line now."""
    proc = run_cli(
        *("train", "--data-dir", str(mnist_dir), "--train-examples", "320", "--epochs", "1"),
        *("--no-progress", "--checkpoint-dir", str(tmp_path / "ck"), "--checkpoint-every", "7"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [ln for ln in proc.stderr.splitlines() if "--checkpoint-every 7" in ln]
    assert len(lines) == 1 and lines[0].startswith("warning: --checkpoint-every 7 is below"), lines
    assert "pass --steps-per-execution 7" in lines[0] and "_" not in lines[0]  # the flags' words
    assert "UserWarning" not in proc.stderr and "warnings.warn(" not in proc.stderr


@pytest.mark.parametrize(
    "backend, model", [("jax", "user_models:tiny"), ("tensorflow", "user_models:subclassed")]
)
def test_an_uncompiled_model_without_a_loss_trains_as_the_built_in_ones(
    backend, model, tmp_path, mnist_dir
):
    """On ce8b8dc such a --model trained on the earlier loop (its ckpt-* checkpoints, none of
    fit's guarantees); now through mirrorfit.fit, compiled as the built-in models are (sparse
    categorical crossentropy, accuracy, uint8 pixels scaled in the model): its checkpoint is
    scored and its .keras file saved on [0, 1] images, as the run scored its test split."""
    ckpt, kept = tmp_path / "c", tmp_path / "m.keras"
    common = ("--backend", backend, "--model", model, "--train-examples", "2000")
    proc = run_cli(
        "train",
        *common,
        "--epochs",
        "2",
        "--no-progress",
        "--checkpoint-dir",
        str(ckpt),
        "--save-keras",
        str(kept),
        "--metrics-out",
        str(tmp_path / "m.json"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "loss: sparse_categorical_crossentropy (the default; --loss chooses)" in proc.stderr
    meta = json.loads((ckpt / "epoch-000002" / "meta.json").read_text())
    assert meta["default_compile"] is True and meta["pixels"] is True
    accuracy = json.loads((tmp_path / "m.json").read_text())["test"]["accuracy"]
    assert accuracy > 0.6  # learnt: the pixels reached it in [0, 1]
    scored = run_cli("evaluate", "--checkpoint-dir", str(ckpt), "--model", model)
    assert scored.returncode == 0, scored.stderr[-3000:]
    assert f"test accuracy {accuracy:.4f}" in scored.stdout
    import keras

    import user_models  # noqa: F401 (its subclassed model, registered for load_model)

    from mirrorfit.data.mnist import load_mnist

    splits = load_mnist(mnist_dir, download=False)
    plain = keras.saving.load_model(kept)  # takes images in [0, 1], not uint8
    scores = plain.predict(splits.x_test.astype("float32") / 255, verbose=0)
    assert np.mean(np.argmax(scores, axis=1) == splits.y_test) == pytest.approx(accuracy, abs=1e-4)
    if backend == "tensorflow":  # a subclassed model exported on the input it trained on
        exported = run_cli(
            *("export", "--checkpoint-dir", str(ckpt), "--model", model),
            *("--export-dir", str(tmp_path / "models" / "m")),
        )
        assert exported.returncode == 0, exported.stderr[-3000:]
        served = run_cli("evaluate", "--saved-model", str(tmp_path / "models" / "m" / "0001"))
        assert f"test accuracy {accuracy:.4f}" in served.stdout, served.stderr[-3000:]
        assert "UserWarning" not in scored.stderr + exported.stderr


@pytest.mark.parametrize(
    "backend, model, needles",
    [
        # on ce8b8dc trained on its logits without a word (2 epochs of 10,000 images: test
        # accuracy 0.0845, its softmax twin 0.8419): the default loss takes probabilities
        *[
            (b, "logits", ["its last layer 'dense' gives linear outputs", "from_logits=True"])
            for b in ("jax", "tensorflow")
        ],
        # tracebacks from wrapping it to take uint8 pixels (a hostile pass)
        ("tensorflow", "two_inputs", ["takes 2 inputs, and the data one array of images"]),
        ("jax", "keyword_call", ["cannot be called on one array of images (TypeError"]),
        # trained on [0, 1/255] without a word: scaled by mirrorfit, then by the model
        ("tensorflow", "own_rescaling", ["scales its inputs itself (its Rescaling layer"]),
    ],
)
def test_an_uncompiled_model_the_default_compile_cannot_train_is_one_line(backend, model, needles):
    proc = run_cli("train", "--backend", backend, "--model", f"user_models:{model}")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    for needle in needles:
        assert needle in proc.stderr


def test_train_examples_of_an_npz_without_weights(tmp_path, mnist_dir):
    """On ce8b8dc `--train-examples` of a .npz holding no sample_weight_train raised TypeError
    ('NoneType' object is not subscriptable), for any --model (a Keras-user pass)."""
    from mirrorfit.data.mnist import load_mnist

    splits = load_mnist(mnist_dir, download=False)
    path = tmp_path / "digits.npz"
    np.savez(path, x_train=splits.x_train[:600], y_train=splits.y_train[:600])
    out = tmp_path / "m.json"
    proc = run_cli(
        *("train", "--model", "keras_models:compiled_mlp", "--data", str(path)),
        *("--train-examples", "320", "--epochs", "1", "--no-progress", "--metrics-out", str(out)),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(out.read_text())["train_examples"] == 320
