"""engine.step: gradient accumulation, fp16 loss scaling and XLA, each under distribution.

Cases run in fresh interpreters with N logical CPU devices (set before TensorFlow starts).
"""

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import run_isolated

HERE = Path(__file__).parent


def _weights(path):
    with np.load(path) as f:
        return [f[k] for k in sorted(f.files, key=lambda k: int(k.split("_")[1]))]


@pytest.fixture(scope="module")
def accumulated(tmp_path_factory):
    """One step on the 128 batch (1 replica), and 4 accumulated micro-batches on 1 and on 2
    replicas: summaries by name, weights in ``out/NAME.npz``. The runs on the same replica
    count share one interpreter (TensorFlow's start-up is most of a run's time); each builds
    its trainer afresh from the same seed."""
    out = tmp_path_factory.mktemp("accum")
    results = run_isolated(HERE / "accum_driver.py", 1, json.dumps([1, 4]), out)
    results.update(run_isolated(HERE / "accum_driver.py", 2, json.dumps([4]), out))
    return out, results


@pytest.mark.slow
@pytest.mark.parametrize("replicas", [1, 2])
def test_k_micro_batches_equal_one_step_on_the_k_times_larger_batch(accumulated, replicas):
    out, results = accumulated
    out_big, out_acc = out / "x1_accum1.npz", out / f"x{replicas}_accum4.npz"
    big, acc = results["x1_accum1"], results[f"x{replicas}_accum4"]
    assert acc["micro"] == 128 // (replicas * 4)
    # one optimizer update per 4 micro-batches: as many updates as with the big batch
    assert acc["steps"] == acc["iterations"] == big["steps"] == 2 * (2048 // 128)
    assert acc["traced"] == 1
    for a, b in zip(_weights(out_big), _weights(out_acc)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-5)


@pytest.mark.slow
def test_fp16_overflow_on_one_replica_skips_the_step_and_lowers_the_scale():
    out = run_isolated(HERE / "fp16_overflow_driver.py")
    assert (out["compute"], out["output"]) == ("float16", "float32")
    assert out["unchanged"], "an overflowing step must leave every weight as it was"
    assert out["scale_bad"] == out["scale0"] / 2
    assert out["skipped_bad"] == 1
    assert out["finite"] and out["changed_after_good"] > 0  # the next good step applies
    assert out["skipped_end"] == 1


@pytest.mark.slow
def test_xla_gives_the_same_weights_as_no_xla(tmp_path):
    plain = run_isolated(HERE / "xla_driver.py", "mirrorfit.models:mlp", "false", tmp_path / "a")
    xla = run_isolated(HERE / "xla_driver.py", "mirrorfit.models:mlp", "true", tmp_path / "b")
    assert xla["xla"] and not plain["xla"] and xla["notices"] == []
    for a, b in zip(_weights(tmp_path / "a.npz"), _weights(tmp_path / "b.npz")):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-5)


@pytest.mark.slow
def test_a_model_xla_cannot_compile_gets_a_message_and_trains_without(tmp_path):
    out = run_isolated(
        HERE / "xla_driver.py", "user_models:not_xla_compilable", "true", tmp_path / "u"
    )
    assert out["xla"] is False and out["steps"] == 1024 // 64
    assert len(out["notices"]) == 1
    assert out["notices"][0].startswith(
        "XLA cannot compile this model (unsupported operation(s): PyFunc)"
    )
    assert "training without --xla" in out["notices"][0]
