"""`mirrorfit evaluate --data SOURCE`: a checkpoint or a SavedModel scored on a source's test
split (what its training run reported); a source without one, or whose examples or classes the
model cannot take, is one line and exit code 2."""

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import run_isolated
from data_fixtures import mnist, write_png_folder
from mirrorfit.cli import main

HERE = Path(__file__).parent


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--data", "synthetic"], "--data synthetic has no test split to evaluate on"),
        (["--data", "{tmp}/*.tfrecord"], "TFRecord sources are training examples only"),
        (["--data", "{tmp}/missing.npz"], "--data {tmp}/missing.npz: no such file"),
        (["--image-size", "32,32"], "--image-size resizes images read from files"),
        (["--data", "{tmp}", "--data-dir", "{tmp}"], "--data-dir says where MNIST is"),
        (["--data", "{tmp}", "--image-size", "28"], "--image-size 28: expected 2 positive"),
    ],
)
def test_bad_evaluate_flags_are_one_line_exit_2(tmp_path, capsys, args, needle):
    (tmp_path / "a.tfrecord").write_bytes(b"")
    code = main(
        [
            "evaluate",
            "--checkpoint-dir",
            str(tmp_path / "ckpt"),
            *[a.replace("{tmp}", str(tmp_path)) for a in args],
        ]
    )
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1, lines
    assert (
        lines[0].startswith("mirrorfit: error:")
        and needle.replace("{tmp}", str(tmp_path)) in lines[0]
    ), lines


def test_exactly_one_model_is_evaluated(capsys):
    assert main(["evaluate"]) == 2
    assert "pass exactly one of --checkpoint-dir or --saved-model" in capsys.readouterr().err


@pytest.mark.slow
def test_checkpoint_and_saved_model_score_a_folders_test_split_as_training_did(tmp_path):
    """One interpreter trains on an image folder (train/ and test/), then evaluates the
    checkpoint and the exported SavedModel (raw uint8 signature) on it, and refuses sources
    the model cannot take."""
    x, y = mnist(640)
    write_png_folder(tmp_path / "imgs" / "train", x, y)
    write_png_folder(tmp_path / "imgs" / "test", *mnist(200, split="test"))
    np.savez(tmp_path / "no_test.npz", x_train=x, y_train=y)
    twelve = np.arange(36) % 12  # 12 class folders: more than the model's 10 outputs
    write_png_folder(tmp_path / "twelve" / "train", x[:36], twelve)
    write_png_folder(tmp_path / "twelve" / "test", x[36:72], twelve)
    imgs, ckpt, models = tmp_path / "imgs", tmp_path / "ckpt", tmp_path / "models" / "m"
    runs = {
        "train": [
            "train",
            "--data",
            str(imgs),
            "--epochs",
            "1",
            "--global-batch-size",
            "32",
            "--checkpoint-dir",
            str(ckpt),
            "--export-dir",
            str(models),
            "--export-preprocessing",
            "--metrics-out",
            str(tmp_path / "train.json"),
            "--no-progress",
        ],
        "checkpoint": [
            "evaluate",
            "--checkpoint-dir",
            str(ckpt),
            "--data",
            str(imgs),
            "--metrics-out",
            str(tmp_path / "ckpt.json"),
        ],
        "saved_model": [
            "evaluate",
            "--saved-model",
            str(models),
            "--data",
            str(imgs),
            "--metrics-out",
            str(tmp_path / "saved.json"),
        ],
        "mnist": ["evaluate", "--checkpoint-dir", str(ckpt)],
        "resized": [
            "evaluate",
            "--checkpoint-dir",
            str(ckpt),
            "--data",
            str(imgs),
            "--image-size",
            "32,32",
        ],
        "no_test": [
            "evaluate",
            "--saved-model",
            str(models),
            "--data",
            str(tmp_path / "no_test.npz"),
        ],
        "classes": ["evaluate", "--checkpoint-dir", str(ckpt), "--data", str(tmp_path / "twelve")],
    }
    out = run_isolated(HERE / "evaluate_runs_driver.py", json.dumps(runs), tmp_path, timeout=600)
    assert out["train"][0] == 0, out["train"][1][-2000:]
    trained = out["train.json"]
    for name in ("checkpoint", "saved_model"):
        assert out[name][0] == 0, out[name][1][-2000:]
        result = out[{"checkpoint": "ckpt.json", "saved_model": "saved.json"}[name]]
        assert result["examples"] == 200 == trained["test_examples"]
        assert result["test_accuracy"] == pytest.approx(trained["test_accuracy"], abs=1e-4)
        assert result["test_loss"] == pytest.approx(trained["test_loss"], rel=1e-3)
        assert result["data"].startswith("image folder") and f"of --data {imgs}" in out[name][2]
    for name, needle in (
        (
            "mnist",
            "--data mnist gives examples of shape 28x28 but the model of "
            f"{ckpt} (epoch-000001) takes 28x28x1",
        ),
        ("resized", "gives examples of shape 32x32x1 but the model of"),
        ("no_test", "has no test split to evaluate on: the file has no x_test/y_test"),
        ("classes", "has 12 class folders but the model of"),
    ):
        rc, err, _ = out[name]
        errors = [ln for ln in err.splitlines() if ln.startswith("mirrorfit: error:")]
        assert rc == 2 and len(errors) == 1 and "Traceback" not in err, err[-2000:]
        assert needle in errors[0], errors[0]


# -- in this process, on untrained SavedModels (seconds): the classes and labels a model takes --


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Untrained MLPs exported as SavedModels: image-folder shaped with 12 and 3 outputs,
    MNIST-array shaped with 10."""
    import keras

    from mirrorfit.artifacts.export import export_saved_model
    from mirrorfit.models.build import mlp

    root = tmp_path_factory.mktemp("exported")
    keras.utils.set_random_seed(0)
    return {
        name: str(export_saved_model(mlp(shape, classes), root / name))
        for name, shape, classes in (
            ("twelve", (28, 28, 1), 12),
            ("three", (28, 28, 1), 3),
            ("arrays", (28, 28), 10),
        )
    }


def _main(capsys, *args):
    code = main(["evaluate", *map(str, args)])
    captured = capsys.readouterr()
    errors = [ln for ln in captured.err.splitlines() if ln.strip()]
    return code, captured.out, errors


def test_a_model_with_more_outputs_than_class_folders_is_evaluated(tmp_path, exported, capsys):
    """`mirrorfit train --num-classes 12` on a 10-class folder makes 12 outputs: evaluate takes
    that model on that folder (it used to require exactly 10), and refuses one with fewer."""
    x, y = mnist(20)
    write_png_folder(tmp_path / "imgs" / "train", x, y)
    write_png_folder(tmp_path / "imgs" / "test", *mnist(30, split="test"))
    code, out, errors = _main(
        capsys,
        "--saved-model",
        exported["twelve"],
        "--data",
        tmp_path / "imgs",
        "--metrics-out",
        tmp_path / "m.json",
    )
    assert code == 0 and not errors, errors
    assert "on 30 examples" in out
    result = json.loads((tmp_path / "m.json").read_text())
    assert result["examples"] == 30 and 0 <= result["test_accuracy"] <= 1
    code, _, errors = _main(capsys, "--saved-model", exported["three"], "--data", tmp_path / "imgs")
    assert code == 2 and len(errors) == 1, errors
    assert f"--data {tmp_path / 'imgs'} has 10 class folders but the model of" in errors[0]
    assert (
        "has 3 outputs, fewer; evaluate on a folder with the class folders it was "
        "trained on" in errors[0]
    )


def test_a_folder_of_test_alone_is_evaluated(tmp_path, exported, capsys):
    """test/ without train/ is scored on its own class folders (the first 25 test images have
    no 8: 9 folders), with a note on how its labels are numbered."""
    write_png_folder(tmp_path / "held" / "test", *mnist(25, split="test"))
    code, out, lines = _main(
        capsys, "--saved-model", exported["twelve"], "--data", tmp_path / "held"
    )
    assert code == 0 and "on 25 examples" in out, lines
    assert len(lines) == 1 and lines[0].startswith("mirrorfit: note:"), lines
    assert "its 9 class folders are labels 0-8 by name, for a model of 12 outputs" in lines[0]


@pytest.fixture
def user_source(monkeypatch):
    import sys
    import types

    module = types.ModuleType("evaluate_fixture")
    monkeypatch.setitem(sys.modules, "evaluate_fixture", module)
    return module


def test_a_label_past_the_outputs_in_a_test_dataset_is_one_line(exported, user_source, capsys):
    """A dataset's labels are checked as it is scored (one pass): a label past the outputs
    would be an IndexError, a negative one a silently wrong score."""
    import tensorflow as tf

    x, y = mnist(12, split="test")
    for bad, needle in (
        (12, "test label 12 (example 7) is past the model's 10 outputs (labels 0-9)"),
        (-1, "test label -1 (example 7) is negative"),
    ):
        labels = y.copy()
        labels[7] = bad
        user_source.load = lambda labels=labels: (
            (x, y),
            None,
            tf.data.Dataset.from_tensor_slices((x, labels)),
        )
        code, _, errors = _main(
            capsys, "--saved-model", exported["arrays"], "--data", "evaluate_fixture:load"
        )
        assert code == 2 and len(errors) == 1 and needle in errors[0], errors
    user_source.load = lambda: ((x, y), None, tf.data.Dataset.from_tensor_slices((x, y)))
    code, out, errors = _main(
        capsys, "--saved-model", exported["arrays"], "--data", "evaluate_fixture:load"
    )
    assert code == 0 and "on 12 examples" in out, errors

    def failing():  # the user's own pipeline fails halfway: its reason, in one line
        yield from zip(x[:3], y[:3])
        raise OSError("the bucket went away")

    user_source.load = lambda: (
        (x, y),
        None,
        tf.data.Dataset.from_generator(
            failing,
            output_signature=(tf.TensorSpec((28, 28), tf.uint8), tf.TensorSpec((), tf.int64)),
        ),
    )
    code, _, errors = _main(
        capsys, "--saved-model", exported["arrays"], "--data", "evaluate_fixture:load"
    )
    assert code == 2 and len(errors) == 1, errors
    assert "reading its test split failed" in errors[0] and "bucket went away" in errors[0]


def test_a_function_source_is_scored_without_reading_its_train_split(exported, user_source, capsys):
    """Only the test split is read: a train dataset that fails when read (at scale: huge or
    lazy) is never touched (evaluate used to read every training label first)."""
    import tensorflow as tf

    x, y = mnist(12, split="test")

    def unreadable():
        raise RuntimeError("the training split was read")
        yield  # a generator

    train = tf.data.Dataset.from_generator(
        unreadable,
        output_signature=(tf.TensorSpec((28, 28), tf.uint8), tf.TensorSpec((), tf.int64)),
    )
    user_source.load = lambda: {"train": train, "test": (x, y)}
    code, out, errors = _main(
        capsys, "--saved-model", exported["arrays"], "--data", "evaluate_fixture:load"
    )
    assert code == 0 and not errors and "on 12 examples" in out, errors


def test_saved_models_that_are_not_mirrorfit_exports_are_one_line(
    tmp_path, exported, user_source, capsys
):
    """A version folder named 1 (not 0001) is found; a damaged saved_model.pb, or a SavedModel
    without mirrorfit's signature, is one line (they were a wrong path and tracebacks)."""
    import shutil

    import tensorflow as tf

    user_source.load = lambda: (mnist(20), None, mnist(10, split="test"))
    shutil.copytree(exported["arrays"], tmp_path / "short" / "1")
    (tmp_path / "junk" / "0001").mkdir(parents=True)
    (tmp_path / "junk" / "0001" / "saved_model.pb").write_bytes(b"not a protobuf")
    module = tf.Module()
    module.f = tf.function(lambda x: {"y": x * 2}, input_signature=[tf.TensorSpec([None])])
    tf.saved_model.save(module, str(tmp_path / "foreign" / "0001"), signatures={"other": module.f})
    code, out, errors = _main(
        capsys, "--saved-model", tmp_path / "short", "--data", "evaluate_fixture:load"
    )
    assert code == 0 and f"{tmp_path / 'short' / '1'}: test accuracy" in out, errors
    for name, needle in (
        ("junk", "0001 is not a readable SavedModel ("),
        ("foreign", "has no serving_default signature taking 'images'"),
        ("foreign", "a compiled --model's export takes its own inputs: evaluate its checkpoint"),
    ):
        code, _, errors = _main(
            capsys, "--saved-model", tmp_path / name, "--data", "evaluate_fixture:load"
        )
        assert code == 2 and len(errors) == 1 and needle in errors[0], errors


def _save_signature(folder, spec, fn):
    """A SavedModel whose serving_default takes 'images' as ``spec`` and gives
    'probabilities' as ``fn`` computes them (seconds: no Keras)."""
    import tensorflow as tf

    module = tf.Module()
    module.f = tf.function(
        lambda images: {"probabilities": fn(images)},
        input_signature=[tf.TensorSpec(spec[0], spec[1], name="images")],
    )
    tf.saved_model.save(module, str(folder / "1"), signatures={"serving_default": module.f})
    return folder


def test_saved_models_of_odd_shapes_or_dtypes_are_one_line(tmp_path, user_source, capsys):
    """Right names, wrong signature: an output of rank 1, an output of one row whatever the
    batch, an input of unknown rank or of int32 were an IndexError, a ValueError or a
    TensorFlow error; each is one line naming the problem."""
    import tensorflow as tf

    user_source.load = lambda: (mnist(20), None, mnist(10, split="test"))
    flat = lambda x: tf.reshape(tf.cast(x, tf.float32), [tf.shape(x)[0], -1])[:, :10]  # noqa: E731
    cases = {
        "a": (
            ([None, 28, 28], tf.float32),
            lambda x: tf.reduce_mean(flat(x), 1),
            "cannot be evaluated: its output 'probabilities' has shape (None,), not "
            "[batch, classes]",
        ),
        "b": (
            ([None, 28, 28], tf.float32),
            lambda x: tf.zeros([1, 10]) + tf.reduce_mean(x),
            "gave probabilities of shape (1, 10) for a batch of 10 examples, not (10, 10)",
        ),
        "c": (
            (None, tf.float32),
            lambda x: tf.zeros([1, 10]) + tf.reduce_mean(x),
            "cannot be evaluated: its input 'images' has unknown rank",
        ),
        "d": (
            ([None, 28, 28], tf.int32),
            flat,
            "cannot be evaluated: its input 'images' is int32, not float32 (or uint8)",
        ),
        "e": (
            ([5, 28, 28], tf.float32),
            flat,
            "its input 'images' takes batches of exactly 5, not any size",
        ),
    }
    for name, (spec, fn, needle) in cases.items():
        _save_signature(tmp_path / name, spec, fn)
        code, _, errors = _main(
            capsys, "--saved-model", tmp_path / name, "--data", "evaluate_fixture:load"
        )
        assert code == 2 and len(errors) == 1 and needle in errors[0], (name, errors)
        assert "export it with mirrorfit export" in errors[0]


def test_a_folder_of_other_channels_is_refused_naming_the_channels(tmp_path, capsys):
    """Grayscale images for an RGB model: --image-size (which resizes) cannot fix that, so
    the line names the channels instead of suggesting it."""
    import tensorflow as tf

    model = _save_signature(
        tmp_path / "rgb",
        ([None, 28, 28, 3], tf.float32),
        lambda x: tf.nn.softmax(tf.reshape(x, [tf.shape(x)[0], -1])[:, :10]),
    )
    write_png_folder(tmp_path / "imgs" / "test", *mnist(10, split="test"))
    code, _, errors = _main(capsys, "--saved-model", model, "--data", tmp_path / "imgs")
    assert code == 2 and len(errors) == 1, errors
    assert "gives examples of shape 28x28x1 but the model of" in errors[0]
    assert "its images decode to 1 channels, the model takes 3" in errors[0]
    assert "--image-size" not in errors[0]
