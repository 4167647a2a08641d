"""models: the chapter's MLP and CNN, keras.applications by name, and user models from
package.module:function."""

import math
import re
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest

from conftest import fresh_env, run_isolated
from mirrorfit.errors import ConfigError
from mirrorfit.models.names import APPLICATIONS, check_input_shape, check_model_name
from mirrorfit.models.build import model_factory
from mirrorfit.models.precision import Precision

HERE = Path(__file__).parent


def test_mlp_layers_as_in_the_chapter():
    m = model_factory("mlp")()
    assert [type(layer).__name__ for layer in m.layers] == ["Flatten", "Dense", "Dense"]
    assert m.layers[1].units == 100 and m.count_params() == 784 * 100 + 100 + 100 * 10 + 10


def test_cnn_layers_as_in_the_chapter():
    m = model_factory("cnn")()
    convs = [layer for layer in m.layers if isinstance(layer, keras.layers.Conv2D)]
    assert [(c.filters, c.kernel_size) for c in convs] == [
        (64, (7, 7)),
        (128, (3, 3)),
        (128, (3, 3)),
    ]
    assert any(isinstance(layer, keras.layers.Dropout) and layer.rate == 0.5 for layer in m.layers)
    out = m(np.zeros((2, 28, 28), np.float32))
    np.testing.assert_allclose(np.sum(out, axis=1), 1.0, rtol=1e-5)


def test_user_model_from_module_function():
    m = model_factory("user_models:tiny")()
    assert m.name == "tiny"


@pytest.mark.parametrize(
    "spec,match",
    [
        ("resnet", "unknown model 'resnet'"),
        ("no_such_module_xyz:f", "cannot import module 'no_such_module_xyz'"),
        ("user_models:missing", "has no function 'missing'"),
    ],
)
def test_bad_model_specs(spec, match):
    with pytest.raises(ConfigError, match=match):
        model_factory(spec)


def test_user_function_must_return_a_model():
    with pytest.raises(ConfigError, match="not a keras.Model"):
        model_factory("user_models:not_a_model")()


def test_config_knows_the_reference_models_by_name():
    # config refuses an unknown --model before Keras loads, from its own list of names
    from mirrorfit.config import MODELS
    from mirrorfit.models.build import REFERENCE_MODELS

    assert tuple(REFERENCE_MODELS) == MODELS


# -- keras.applications by name ---------------------------------------------------------------


def test_application_names_are_keras_s():
    # model_names lists them in plain Python (no TF before the config check): keep in step
    names = {
        n
        for n in dir(keras.applications)
        if n[:1].isupper() and callable(getattr(keras.applications, n))
    }
    assert set(APPLICATIONS) == names


def test_application_built_for_the_data_shape_and_classes_in_float32_out():
    m = model_factory("MobileNetV2", input_shape=(32, 32, 3), num_classes=7)()
    assert m.input_shape == (None, 32, 32, 3) and m.output_shape == (None, 7)
    out = m(np.random.default_rng(0).random((2, 32, 32, 3), np.float32))
    np.testing.assert_allclose(np.sum(out, axis=1), 1.0, rtol=1e-5)
    with Precision("bf16").building():  # as the runner builds it
        mixed = model_factory("MobileNetV2", input_shape=(32, 32, 3), num_classes=7)()
    convs = [layer for layer in mixed.layers if isinstance(layer, keras.layers.Conv2D)]
    assert convs[0].compute_dtype == "bfloat16"
    assert mixed.output.dtype == "float32"  # softmax in float32: the loss sees fine probs


def test_application_default_is_keras_s_imagenet_shape():
    m = model_factory("ResNet50")()
    assert m.input_shape == (None, 224, 224, 3) and m.output_shape == (None, 1000)


@pytest.mark.parametrize(
    "spec,suggested",
    [
        ("resnet50", "ResNet50"),
        ("MobilenetV2", "MobileNetV2"),
        ("DenseNet12", "DenseNet121"),
        ("MLP", "mlp"),
    ],
)
def test_misspelt_names_get_the_close_match(spec, suggested):
    with pytest.raises(
        ConfigError, match=rf"unknown model '{spec}' \(did you mean '{suggested}'\?\)"
    ):
        model_factory(spec)


@pytest.mark.parametrize(
    "spec,shape,needles",
    [
        ("ResNet50", (28, 28), ["--input-shape 28,28", "height,width,channels", "32,32,3"]),
        ("ResNet50", (31, 64, 3), ["at least 32x32", "--input-shape 32,32,3"]),
        ("InceptionV3", (64, 64, 3), ["at least 75x75", "--input-shape 75,75,3"]),
        ("Xception", (70, 80, 1), ["at least 71x71", "--input-shape 71,71,3"]),
        ("VGG16", (32, 0, 3), ["positive"]),
    ],
)
def test_shapes_an_architecture_cannot_take_are_one_line(spec, shape, needles):
    with pytest.raises(ConfigError) as info:  # from the factory, before anything is built
        model_factory(spec, input_shape=shape, num_classes=10)
    message = str(info.value)
    assert "\n" not in message and all(n in message for n in needles), message
    with pytest.raises(ConfigError):  # the same check in plain Python, for the config
        check_input_shape(spec, shape)


def test_smallest_shapes_pass_the_check():
    for spec in APPLICATIONS:
        size = 75 if spec.startswith("Inception") else 71 if spec == "Xception" else 32
        check_input_shape(spec, (size, size, 1))  # any channel count builds without weights
        check_model_name(spec)


def test_config_takes_application_names_without_loading_tensorflow():
    out = subprocess.run(
        [sys.executable, str(HERE / "config_names_driver.py")],
        capture_output=True,
        text=True,
        check=True,
        env=fresh_env(),
    ).stdout.splitlines()
    assert "did you mean 'ResNet50'" in out[0] and out[1] == "False"


def test_user_function_gets_shape_and_classes_when_it_takes_them():
    m = model_factory("user_models:sized", input_shape=(8, 8, 3), num_classes=4)()
    assert m.input_shape == (None, 8, 8, 3) and m.output_shape == (None, 4)
    assert model_factory("user_models:tiny", input_shape=(8, 8, 3))().name == "tiny"


def test_cnn_takes_images_with_channels():
    m = model_factory("cnn", input_shape=(32, 32, 3), num_classes=5)()
    assert m.output_shape == (None, 5)
    assert not any(isinstance(layer, keras.layers.Reshape) for layer in m.layers)


def test_application_exports_as_saved_model_and_keras_file(tmp_path):
    from mirrorfit.artifacts.export import export_saved_model
    from mirrorfit.artifacts.keras_file import save_keras
    import tensorflow as tf

    # MobileNet (v1): the quickest application to export (~6 s here; MobileNetV2 ~9 s)
    m = model_factory("MobileNet", input_shape=(32, 32, 3), num_classes=3)()
    x = np.random.default_rng(1).random((2, 32, 32, 3), np.float32)
    want = np.asarray(m(x, training=False))
    path = export_saved_model(m, tmp_path / "models")
    got = tf.saved_model.load(str(path)).signatures["serving_default"](images=tf.constant(x))
    np.testing.assert_allclose(got["probabilities"].numpy(), want, atol=1e-6)
    loaded = keras.saving.load_model(save_keras(m, tmp_path / "m.keras"))
    np.testing.assert_allclose(np.asarray(loaded(x, training=False)), want, atol=1e-6)


@pytest.mark.slow
def test_application_trains_under_mirrorfit_on_two_replicas():
    out = run_isolated(HERE / "application_replicas_driver.py")
    assert out["replicas"] == 2 and out["steps"] == 1
    assert math.isfinite(out["loss"]) and out["loss"] > 0


@pytest.mark.parametrize(
    "spec, needle",
    [
        (
            "user_models:exiting",
            "--model 'user_models:exiting': the function exited (SystemExit: "
            "0) instead of returning a keras.Model",
        ),
        (
            "user_models:raising",
            "--model 'user_models:raising': the function raised ValueError: no such layer size",
        ),
    ],
)
def test_a_model_function_that_exits_or_raises_is_one_line(spec, needle):
    """SystemExit from a --model function ended the run with its code and no line; another
    exception was a traceback."""
    with pytest.raises(ConfigError) as e:
        model_factory(spec)()
    assert needle in str(e.value), str(e.value)


@pytest.mark.parametrize(
    "shape,said",
    [
        ((2, 2, 3), "takes images of at least 4x4 pixels (it pools twice by 2); these are 2x2"),
        ((3, 3), "these are 3x3: give --image-size 4,4 or larger"),
        ((784,), "takes images, (height, width) or (height, width, channels)"),
    ],
)
def test_the_cnn_names_the_smallest_input_it_takes(shape, said):
    from mirrorfit.models.build import cnn

    with pytest.raises(ValueError, match=re.escape(said)):
        cnn(shape)
    assert cnn((4, 4, 3)).output_shape == (None, 10)


@pytest.mark.parametrize("backend", ["jax", "tensorflow"])
def test_too_small_for_the_cnn_is_one_line_on_the_command_line(backend):
    from conftest import run_cli

    proc = run_cli(
        "train",
        "--backend",
        backend,
        "--model",
        "cnn",
        "--data",
        "synthetic",
        "--input-shape",
        "2,2,3",
        "--epochs",
        "1",
        "--no-progress",
        without_tensorflow=backend == "jax",
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "mirrorfit: error: --model cnn takes images of at least 4x4 pixels (it pools twice by "
        "2); these are 2x2: give --image-size 4,4 or larger (--input-shape for synthetic "
        "data), or use --model mlp"
    ), proc.stderr[-3000:]
