"""A 2-D mesh (``mirrorfit.setup(replicas=4, model_parallel=2)``: 2 data groups of 2): each
weight created split over its model group, held so through ``fit`` and after it, trained as
one compiled program over the global batch (XLA's partitioner inserting the collectives), to
the weights of the data-parallel run (grid_driver.py, 4 logical devices, SGD). Before, there
was no such mesh: every device held every whole weight."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from conftest import run_isolated

HERE = Path(__file__).parent


@pytest.mark.slow
def test_a_data_by_model_mesh_splits_the_weights_and_trains_as_data_parallel(tmp_path):
    grid = run_isolated(HERE / "grid_driver.py", "2", tmp_path)
    flat = run_isolated(HERE / "grid_driver.py", "1", tmp_path)
    for shares in (grid["built"], grid["trained"]):  # kernels split in 2; biases under 1,024
        assert {p: s for p, s in shares.items() if p.endswith("kernel")} == {
            f"sequential/{d}/kernel": 0.5 for d in ("dense", "dense_1", "dense_2")
        }
        assert all(s == 1.0 for p, s in shares.items() if p.endswith("bias"))
    assert all(s == 1.0 for s in flat["trained"].values())
    assert "2 data groups" in grid["sharding"]
    # SGD from the same weights, shuffle=False, a partial last batch: float rounding apart
    ours, theirs = np.load(tmp_path / "grid-2.npz"), np.load(tmp_path / "grid-1.npz")
    for name in theirs:
        np.testing.assert_allclose(ours[name], theirs[name], rtol=0, atol=1e-6, err_msg=name)
    for key, values in flat["history"].items():
        np.testing.assert_allclose(grid["history"][key], values, rtol=1e-5, err_msg=key)
    assert grid["evaluate"] == pytest.approx(grid["keras_evaluate"], rel=1e-5)
    assert grid["predict_apart"] < 1e-5


def test_a_mesh_the_devices_cannot_make_is_one_line(tmp_path):
    refused = run_isolated(HERE / "grid_driver.py", "3", tmp_path)["refused"]
    assert refused[0] == (
        "model_parallel=3 does not divide the 4 replicas into groups; give a divisor of the "
        "replicas"
    )
    assert refused[1].startswith("model_parallel=2 splits the weights over the model axis")
