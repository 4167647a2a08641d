"""mirrorfit.predict on 2 replicas against the model's own predict, and Keras's own predict,
evaluate, save and export after mirrorfit.fit on every input dtype Keras takes, on both
engines (tests/fitting/predicting.py, one process per engine: the logical devices are set
before the framework starts). The same weights on both sides: the outputs agree to float32
rounding (measured: at most 4.8e-7, the replicas' matmuls run on other shapes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import _env

HERE = Path(__file__).resolve().parent
DTYPES = ("float16", "float32", "float64", "int32", "int64", "uint8", "bool")


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["jax", "tensorflow"])
def test_predict_is_the_models_own_and_keras_calls_keep_working(backend, tmp_path):
    out = tmp_path / "predict.json"
    proc = subprocess.run(
        [sys.executable, str(HERE / "predicting.py"), backend, str(out)],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    r = json.loads(out.read_text())
    for case, apart in r["apart"].items():
        assert apart < 1e-5, case
    assert r["shapes"]["two_outputs"] == [[37, 3], [37, 1]]  # the partial batch's rows kept
    assert r["shapes"]["steps"] == [[16, 3], [16, 1]]
    assert r["shapes"]["int_and_bool"] == [[11, 2]]
    # a SeedGenerator's state carried from batch to batch and back to the model, as Keras's
    assert r["seed_states"][0] == r["seed_states"][1] == [[3, 4]]
    assert r["draws_differ"] > 0.1
    assert r["own_keys"] == ["logits", "probs"]  # the model's own predict_step's outputs
    assert r["callback_batches"] == [[0, 16], [1, 16], [2, 5]]
    assert [w[:48] for w in r["eager_warnings"]] == [
        "model.run_eagerly=True: mirrorfit compiles every"
    ]
    errors = r["errors"]
    assert errors["zero_batch"].startswith("batch_size=0: give a whole number")
    assert errors["float_batch"].startswith("batch_size=2.5")
    assert errors["verbose"].startswith("verbose=3")
    assert errors["bool_steps"].startswith("steps=True")
    assert errors["no_x"].startswith("x=None")
    assert "takes a keras.Model, not object" in errors["not_model"]
    assert "not a keras.callbacks.Callback" in errors["not_callback"]  # an AttributeError
    assert errors["ragged"].startswith("x holds a tf.RaggedTensor")
    assert set(r["own_calls"]) == set(DTYPES)
    # Keras's own export on JAX 0.11 (Python 3.12's pin) writes StableHLO that TensorFlow
    # 2.21 cannot read (measured: "Cannot deserialize computation"), without
    # mirrorfit too; JAX 0.10's it reads
    skewed = r.get("jax_version", [0, 0]) >= [0, 11]
    for dtype, calls in r["own_calls"].items():
        keras_loss, our_loss = calls["evaluate"]
        assert keras_loss == pytest.approx(our_loss, rel=1e-5), dtype
        for name in ("predict_vs_ours", "loaded_apart"):
            assert calls[name] < 1e-5, (dtype, name)
        if skewed:
            assert "annot deserialize computation" in calls["exported_apart"]
        else:
            assert calls["exported_apart"] < 1e-5, dtype
