"""job.data: the run's data as job.train uses it. The flags reach the source; a model that
cannot take the data, and a file gone mid-run, are one line; the checkpoint and the profile are
told what the data is made of. Synthetic data and a 1-replica default strategy keep it fast."""

import dataclasses

import keras
import pytest
import tensorflow as tf

from mirrorfit.config import load_config
from mirrorfit.engine.backends import GLOBAL_BATCH
from mirrorfit.engine.tensorflow.distribution import Distribution
from mirrorfit.errors import DataError
from mirrorfit.job.data import (
    check_model_fits,
    input_source,
    load_run_data,
)


def _dist(workers: int = 1, split: str = GLOBAL_BATCH) -> Distribution:
    return Distribution(
        strategy=tf.distribute.get_strategy(),
        kind="multi-worker",
        replicas=workers,
        local_replicas=1,
        workers=workers,
        input_split=split,
    )


def _model(input_shape, outputs: int) -> keras.Model:
    pool = (
        keras.layers.GlobalAveragePooling2D() if None in input_shape else keras.layers.Flatten()
    )  # Flatten needs every size known
    return keras.Sequential([keras.Input(input_shape), pool, keras.layers.Dense(outputs)])


@pytest.fixture(scope="module")
def data():
    config = load_config(
        data="synthetic", input_shape="4,4,1", num_classes=3, train_examples=32, seed=7
    )
    return load_run_data(config, 8, _dist())


def test_load_run_data_opens_data_as_the_flags_say(data):
    assert (data.kind, data.input_shape, data.num_classes) == ("synthetic", (4, 4, 1), 3)
    assert data.train_examples == 32
    assert (data.train.order.global_batch, data.train.order.seed) == (8, 7)
    assert data.train.steps_per_epoch == 4


def test_a_model_that_takes_the_data_passes(data):
    config = load_config(data="synthetic", input_shape="4,4,1")
    check_model_fits(_model((4, 4, 1), 3), data, config)
    check_model_fits(_model((None, None, 1), 5), data, config)  # any size, more outputs


@pytest.mark.parametrize(
    "shape,outputs,input_shape,needles",
    [
        (
            (28, 28),
            3,
            None,
            [
                "gives examples of shape 4x4x1 but --model mlp takes 28x28",
                "pass --input-shape to build the model for the data",
            ],
        ),
        ((4, 4, 2), 3, "4,4,1", ["takes 4x4x2; give data of that shape"]),
        (
            (4, 4, 1),
            2,
            "4,4,1",
            ["has labels 0-2 (3 classes) but --model mlp has 2 outputs", "pass --num-classes 3"],
        ),
    ],
)
def test_a_model_that_does_not_take_the_data_is_one_line(
    data, shape, outputs, input_shape, needles
):
    config = load_config(data="synthetic", input_shape=input_shape)
    with pytest.raises(DataError) as error:
        check_model_fits(_model(shape, outputs), data, config)
    assert "\n" not in str(error.value)
    for needle in needles:
        assert needle in str(error.value)


def test_input_source_says_how_the_profiled_input_is_read(data, tmp_path):
    plain = load_config(data=str(tmp_path))
    cached = load_config(data=str(tmp_path), cache="memory")
    kind = lambda k: dataclasses.replace(data, kind=k)  # noqa: E731
    assert input_source(data, plain) == "synthetic, one batch repeated"
    assert input_source(kind("folder"), plain) == "image files, decoded every step"
    assert input_source(kind("folder"), cached) == "image files, decoded once (--cache)"
    assert input_source(kind("tfrecord"), plain) == "TFRecord files, decoded every step"
    assert input_source(kind("module"), plain) == "a dataset function, decoded every step"
    assert input_source(kind("module"), cached) == "memory"
    assert input_source(kind("npz"), plain) == "memory"


class _Subclassed(keras.Model):
    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(3)

    def call(self, x):
        return self.dense(keras.ops.reshape(x, (keras.ops.shape(x)[0], -1)))


@pytest.mark.parametrize(
    "model",
    [
        lambda: _Subclassed(),
        lambda: keras.Sequential([keras.layers.Flatten(), keras.layers.Dense(3)]),
    ],
    ids=["subclassed", "sequential-without-input"],
)
def test_a_model_whose_input_is_not_known_yet_is_one_line(data, model):
    """Both were an AttributeError traceback (no .inputs): such a model has no variables
    before its first call, so the optimizer's state cannot be built from them either."""
    config = load_config(data="synthetic", input_shape="4,4,1")
    with pytest.raises(
        DataError,
        match="returns a model whose input is not known before it "
        r"is called .*start it with keras.Input\(shape\)",
    ):
        check_model_fits(model(), data, config)
