"""Shuffled sources are read in Keras's own orders on JAX (orders_driver.py): on main a model
with its own train_step trained epoch 1 on the batches Keras reads only to build the model
(its losses 1e-3 apart), and a shuffled PyDataset likewise on every runner. And two variables
holding one array train (on main: shard='none' crashed in XLA, the buffer donated twice)."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import run_isolated
from pathlib import Path

HERE = Path(__file__).parent


@pytest.mark.slow
def test_shuffled_sources_are_read_in_keras_orders_on_jax():
    ours = run_isolated(HERE / "orders_driver.py", "mirrorfit", "jax")
    theirs = run_isolated(HERE / "orders_driver.py", "keras", "jax")
    for name, losses in theirs.items():
        assert isinstance(ours[name], list), ours[name]
        np.testing.assert_allclose(ours[name], losses, rtol=1e-5, err_msg=name)


@pytest.mark.parametrize("shard", ["none", "all"])
def test_two_variables_holding_one_array_train(shard):
    result = run_isolated(HERE / "shared_array_driver.py", shard)
    assert result["same_object"] and len(result["loss"]) == 2
    assert all(np.isfinite(result["loss"]))
