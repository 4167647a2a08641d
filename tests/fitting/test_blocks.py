"""Blocks of batches and the input thread (plain NumPy, in this process)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from mirrorfit.fitting import blocks as fit_blocks
from mirrorfit.fitting.batches import padded


def _batches(n: int, rows: int = 4, width: int = 3):
    for i in range(n):
        yield padded((np.full((rows, width), i, "float32"), np.zeros((rows, 1), "float32")), 4)


def test_blocks_hold_up_to_s_batches_padded_with_the_last():
    out = list(fit_blocks.blocks(_batches(5), 2))
    assert [b.steps for b in out] == [2, 2, 1]
    assert out[-1].data["x"].shape == (2, 4, 3)  # one shape for every block of the run
    assert (out[-1].data["x"][1] == 4).all()


def test_a_partial_batch_is_padded_and_weighted(monkeypatch):
    batch = padded((np.ones((3, 2), "float32"), np.ones((3,), "int64")), 4)
    assert batch["x"].shape == (4, 2) and batch["y"].dtype == np.int64
    assert batch["mask"].tolist() == [1, 1, 1, 0]
    assert batch["scale"].tolist() == pytest.approx([4 / 3] * 4)


def test_blocks_are_capped_by_their_bytes(monkeypatch):
    monkeypatch.setattr(fit_blocks, "BLOCK_BYTES", 3 * 4 * 3 * 4 + 100)  # about 2 batches
    assert [b.steps for b in fit_blocks.blocks(_batches(5), 50)] == [2, 2, 1]


def test_the_input_thread_ends_when_the_consumer_stops_early():
    before = threading.active_count()
    items = fit_blocks.prefetched(iter(range(100)), depth=2)
    assert next(items) == 0
    items.close()
    deadline = time.monotonic() + 5
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() == before


def test_the_input_thread_error_reaches_the_consumer():
    def broken():
        yield 1
        raise KeyError("mine")

    items = fit_blocks.prefetched(broken())
    assert next(items) == 1
    with pytest.raises(KeyError, match="mine"):
        next(items)


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("drop", [False, True])
def test_array_blocks_are_the_blocks_of_keras_batches(shuffle, drop):
    from keras.src.trainers.data_adapters.array_data_adapter import ArrayDataAdapter

    from mirrorfit.fitting.arrays import array_blocks, arrays_of

    rng = np.random.default_rng(1)
    x = {"a": rng.normal(size=(23, 3)).astype("float32"), "b": np.arange(23)}
    y = rng.integers(0, 4, size=(23, 2))
    source = ArrayDataAdapter(x, y, batch_size=4, shuffle=shuffle)
    np.random.seed(7)
    expected = [padded(b, 4) for b in source.get_numpy_iterator()]
    if drop:
        expected = expected[:-1]
    expected = list(fit_blocks.blocks(expected, 3))
    np.random.seed(7)
    got = list(array_blocks(source, arrays_of(source), 4, 3, drop_remainder=drop))
    assert [b.steps for b in got] == [b.steps for b in expected]
    for g, e in zip(got, expected):
        for key in e.data:
            flat_g = g.data[key] if not isinstance(e.data[key], dict) else g.data[key]["a"]
            flat_e = e.data[key] if not isinstance(e.data[key], dict) else e.data[key]["a"]
            n = g.steps
            np.testing.assert_array_equal(flat_g[:n], flat_e[:n], err_msg=key)
        np.testing.assert_array_equal(g.data["x"]["b"][: g.steps], e.data["x"]["b"][: e.steps])
