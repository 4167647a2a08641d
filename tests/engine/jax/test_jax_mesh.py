"""A 2-D mesh (``mirrorfit.setup(replicas=4, model_parallel=2)``: 2 data groups of 2): each
weight created split over its model group, held so through ``fit`` and after it, trained as
one compiled program over the global batch (XLA's partitioner inserting the collectives), to
the weights of the data-parallel run (grid_driver.py, 4 logical devices, SGD). Before, there
was no such mesh: every device held every whole weight."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import _env, run_isolated

HERE = Path(__file__).parent


@pytest.mark.slow
def test_a_data_by_model_mesh_splits_the_weights_and_trains_as_data_parallel(tmp_path):
    flat = run_isolated(HERE / "grid_driver.py", "1", tmp_path)
    assert all(s == 1.0 for s in flat["trained"].values())
    theirs = np.load(tmp_path / "grid-1-none.npz")
    # ZeRO over the data axis beside the model axis: the kernels' slots (shard="optimizer"),
    # or the kernels too ("all"), split over both (before: refused, "not built yet")
    expected = {"none": (0.5, 0.5), "optimizer": (0.5, 0.25), "all": (0.25, 0.25)}
    for shard, (kernel, slot) in expected.items():
        grid = run_isolated(HERE / "grid_driver.py", "2", tmp_path, shard)
        for shares in (grid["built"], grid["trained"]):  # kernels split; biases under 1,024
            assert {p: s for p, s in shares.items() if p.endswith("kernel")} == {
                f"sequential/{d}/kernel": kernel for d in ("dense", "dense_1", "dense_2")
            }, shard
            assert all(s == 1.0 for p, s in shares.items() if p.endswith("bias"))
        slots = {p: s for p, s in grid["slots"].items() if p.endswith("kernel_momentum")}
        assert set(slots.values()) == {slot} and len(slots) == 3, shard
        assert "2 data groups" in grid["sharding"]
        # SGD with momentum from the same weights, shuffled, a partial last batch: float
        # rounding apart (measured: 3.0e-8, 3.7e-8, 3.7e-8; shuffled, 4.7e-4 apart before
        # the mesh's epoch 1 drew its own permutation, as Keras's fit and the 1-D runner do)
        ours = np.load(tmp_path / f"grid-2-{shard}.npz")
        for name in theirs:
            np.testing.assert_allclose(
                ours[name], theirs[name], rtol=0, atol=1e-6, err_msg=f"{shard} {name}"
            )
        for key, values in flat["history"].items():
            np.testing.assert_allclose(grid["history"][key], values, rtol=1e-5, err_msg=key)
        assert grid["evaluate"] == pytest.approx(grid["keras_evaluate"], rel=1e-5)
        assert grid["predict_apart"] < 1e-5


def test_a_mesh_the_devices_cannot_make_is_one_line(tmp_path):
    refused = run_isolated(HERE / "grid_driver.py", "3", tmp_path)["refused"]
    assert refused[0].startswith(
        "model_parallel=3 (--model-parallel 3) does not divide the 4 replicas into groups; "
        "give a divisor of the replicas, or more replicas (e.g. replicas=6, --replicas 6"
    )
    assert refused[1].startswith("model_parallel=0: give the devices each weight is split")


@pytest.mark.slow
def test_a_keras_hub_lm_with_lora_trains_alike_whole_split_and_on_the_mesh(tmp_path):
    """hub_lm.py: a KerasHub Gemma (from its config, random weights) with LoRA, SGD, 2
    epochs on 4 devices: ``shard="all"`` and the 2 x 2 mesh end with ``none``'s weights and
    history (measured: 0.0 and 1.7e-8 apart), its weights split where made split."""
    runs = {}
    for mode in ("none", "all", "grid"):
        out = tmp_path / mode
        proc = subprocess.run(
            [sys.executable, str(HERE / "hub_lm.py"), mode, str(out)],
            env={**_env(), "KERAS_BACKEND": "jax"},  # the program's engine, for any runner
            capture_output=True,
            text=True,
            timeout=400,
        )
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
        runs[mode] = (json.loads(out.with_suffix(".json").read_text()), np.load(f"{out}.npz"))
    whole, whole_weights = runs["none"]
    assert whole["split"] == 0 and whole["trainable"] == 8  # LoRA's a and b of 4 kernels
    for mode in ("all", "grid"):
        result, weights = runs[mode]
        assert result["split"] > 10, mode
        for name in whole_weights:
            np.testing.assert_allclose(
                weights[name], whole_weights[name], rtol=0, atol=1e-6, err_msg=f"{mode} {name}"
            )
        for key, values in whole["history"].items():
            np.testing.assert_allclose(result["history"][key], values, rtol=1e-5, err_msg=key)
    # counted from the devices (each buffer once): the mesh's model holds one copy of its
    # state split over the model axis of 2, as Keras's own fit leaves it (measured 0.50x of
    # none's); shard="all" splits it over all 4 devices, the frozen backbone too (measured
    # 0.25x; 0.62x while each device held the frozen weights whole as statistics)
    assert runs["grid"][0]["live_bytes"] <= 0.55 * whole["live_bytes"]
    assert runs["all"][0]["live_bytes"] <= 0.3 * whole["live_bytes"]
