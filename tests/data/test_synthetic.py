"""data.synthetic: random batches made once per worker and repeated, with the trainer's
training-data protocol."""

import numpy as np
import pytest
import tensorflow as tf

from mirrorfit.data.pipeline import DataOrder
from mirrorfit.data.synthetic import synthetic_batches
from mirrorfit.errors import ConfigError


def _data(**changes):
    args = dict(input_shape=(6, 5, 3), num_classes=4, global_batch=8, steps_per_epoch=3, seed=7)
    return synthetic_batches(**{**args, **changes})


def test_protocol_and_order():
    data = _data()
    assert data.global_batch == 8 and data.steps_per_epoch == 3
    assert isinstance(data.order, DataOrder)
    assert (data.order.seed, data.order.examples, data.order.global_batch) == (7, 24, 8)
    assert data.order == _data().order  # a resume on the same data is accepted ...
    assert data.order.fingerprint != _data(input_shape=(6, 5, 1)).order.fingerprint  # ... not
    assert data.order.fingerprint != _data(num_classes=5).order.fingerprint  # on other data


def test_one_batch_repeated_for_the_epochs_asked_less_the_skipped():
    elements = list(_data().dataset(start_epoch=1, epochs=3, skip=2))
    assert len(elements) == 2 * 3 - 2
    x, y = elements[0]
    assert x.shape == (8, 6, 5, 3) and x.dtype == tf.float32 and y.dtype == tf.int32
    assert 0 <= float(tf.reduce_min(x)) and float(tf.reduce_max(x)) < 1  # as scaled pixels
    assert set(y.numpy()) <= set(range(4))
    for xi, yi in elements[1:]:
        np.testing.assert_array_equal(xi, x)
        np.testing.assert_array_equal(yi, y)
    again, _ = next(iter(_data().dataset()))
    np.testing.assert_array_equal(again, x)  # seeded: the same batch each run


def test_each_worker_gets_its_share_made_on_its_own():
    data = _data()
    first, _ = next(iter(data.dataset(worker=0, workers=2)))
    second, _ = next(iter(data.dataset(worker=1, workers=2)))
    assert first.shape[0] == second.shape[0] == 4
    assert not np.array_equal(first, second)
    with pytest.raises(ValueError, match="does not split over 3 workers"):
        data.dataset(workers=3)
    with pytest.raises(ValueError, match="outside an epoch"):
        data.dataset(skip=4)


def test_sampled_stream_is_endless_pure_tensorflow():
    data = _data(dtype="bfloat16")

    @tf.function  # as parameter-server workers build it: in a graph, the worker index a tensor
    def first_batches():
        context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=1)
        ds = data.sampled(context).take(5)
        return ds.reduce(tf.constant(0), lambda n, batch: n + tf.shape(batch[0])[0])

    assert int(first_batches()) == 5 * 8
    assert data.dataset().element_spec[0].dtype == tf.bfloat16


def test_small_arrays_for_validation_and_test():
    x, y = _data().arrays(10)
    assert x.shape == (10, 6, 5, 3) and x.dtype == np.uint8 and y.dtype == np.int32
    x2, _ = _data().arrays(10, split=2)
    assert not np.array_equal(x, x2)


@pytest.mark.parametrize(
    "changes,match",
    [
        ({"input_shape": (32, 0, 3)}, "--input-shape must be positive integers"),
        ({"num_classes": 1}, "--num-classes must be an integer >= 2"),
        ({"global_batch": 0}, "--global-batch-size must be an integer >= 1"),
        ({"dtype": "int8"}, "dtype 'int8'"),
    ],
)
def test_bad_values_are_one_line(changes, match):
    with pytest.raises(ConfigError, match=match):
        _data(**changes)
