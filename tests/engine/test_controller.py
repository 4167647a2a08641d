"""engine.controller (with the TF step and loop): data-parallel training that matches one device.

Training runs in fresh interpreters with N logical CPU devices (they must be set before
TensorFlow starts), one per replica count, and saves the trained weights for comparison here.
"""

from pathlib import Path

import numpy as np
import pytest

from conftest import assert_same_weights, run_isolated, runs_by_replicas

HERE = Path(__file__).parent

# The runs of one replica count share one interpreter (TensorFlow's start-up is most of a
# run's time): controller_runs_driver.py. Each builds its strategy, model and optimizer afresh
# from the same seed, so a run gives the weights it would alone (the comparisons below would
# catch it if not).
# name: (replicas, strategy, optimizer, steps per execution)
RUNS = {
    "one_sgd": (1, "auto", "sgd", 8),
    "one_adam": (1, "auto", "adam", 8),
    "two_sgd": (2, "auto", "sgd", 8),
    "two_adam": (2, "auto", "adam", 8),
    "central_storage": (2, "central-storage", "sgd", 8),
    "spe10": (2, "auto", "sgd", 10),
    "spe1": (2, "auto", "sgd", 1),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every run of RUNS: its JSON summary plus "weights"."""
    return runs_by_replicas(
        HERE / "controller_runs_driver.py", RUNS, tmp_path_factory.mktemp("weights")
    )


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_two_replicas_give_the_same_weights_as_one(runs, optimizer):
    one, two = runs[f"one_{optimizer}"], runs[f"two_{optimizer}"]
    assert one["steps"] == two["steps"] == 2 * (2048 // 64)
    assert one["changed"] > 1e-3  # it did train
    assert_same_weights(one["weights"], two["weights"], rtol=1e-4, atol=2e-5)


@pytest.mark.slow
def test_central_storage_matches_one_replica(runs):
    one, central = runs["one_sgd"], runs["central_storage"]
    assert_same_weights(one["weights"], central["weights"], rtol=1e-4, atol=2e-5)
    # Its metrics too: each is one variable the replicas share, and Keras's assign_add (an
    # assign of v + x) summed over 2 replicas doubled it every step (the test count read inf).
    for key in ("loss", "accuracy"):
        assert central[key] == pytest.approx(one[key], rel=1e-4), key
    assert central["test"]["examples"] == one["test"]["examples"] == 3000
    for key in ("loss", "accuracy"):
        assert central["test"][key] == pytest.approx(one["test"][key], rel=1e-4), key


@pytest.mark.slow
def test_steps_per_execution_does_not_change_the_result(runs):
    ten, one = runs["spe10"], runs["spe1"]  # 32 steps: 10+10+10+2, a shorter last call
    assert_same_weights(ten["weights"], one["weights"], rtol=1e-6, atol=1e-7)
    assert ten["traced"] == 1 and one["traced"] == 1  # step counts are tensors: no retracing


@pytest.mark.slow
def test_evaluation_counts_each_example_once_when_not_divisible():
    out = run_isolated(HERE / "uneven_eval_driver.py")
    assert out["result"]["examples"] == 1001  # 15 full batches of 64 + a partial one of 41
    assert out["result"]["accuracy"] == pytest.approx(out["acc"], abs=1e-6)
    assert out["result"]["loss"] == pytest.approx(out["loss"], rel=1e-4)


@pytest.mark.slow
def test_model_built_outside_the_scope_is_refused_clearly():
    error = run_isolated(HERE / "outside_scope_driver.py")["error"]
    assert "not created under this strategy" in error


def test_a_position_past_the_end_of_an_epoch_is_refused_clearly():
    # A trainer restored from a checkpoint of other data once ran out of batches in its last
    # epoch (an OutOfRangeError traceback); the checkpoint now refuses such a resume, and the
    # trainer says so itself for a Python-API caller.
    import keras

    import mirrorfit

    x = np.zeros((128, 28, 28), np.uint8)
    y = np.zeros(128, np.int32)
    trainer = mirrorfit.Trainer(
        strategy=mirrorfit.build_strategy(mirrorfit.configure_devices()),
        model=mirrorfit.models.mlp,
        optimizer=keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(),
        global_batch=32,
    )
    trainer.position = mirrorfit.Position(step_in_epoch=6)  # of an epoch of 4 steps
    with pytest.raises(mirrorfit.ConfigError, match="at step 6 of an epoch of only 4 steps"):
        trainer.fit(mirrorfit.train_batches(x, y, global_batch=32, seed=0), epochs=1)


# What the Trainer API (and mirrorfit.fit's sparse labels) refuse, on either engine: each case
# one ValueError naming both sizes; before, JAX cut or zeroed them and both engines halved the
# gradients of batches smaller than the trainer's global batch.
@pytest.mark.parametrize("backend", ["jax", "tensorflow"])
def test_data_that_would_train_something_else_is_a_value_error(backend):
    out = run_isolated(HERE / "refusals_driver.py", backend)
    sizes = "x has 100 examples and y has 99; give as many labels as inputs"
    assert out["evaluate"] == f"evaluate: {sizes}"
    assert out["validation"] == f"the validation data: {sizes}"
    assert out["eval_labels"].startswith(
        "the evaluation data has label 99, but the model has 10 outputs (labels 0..9)"
    )
    assert out["train_labels"].startswith(
        "the training data has label 9, but the model has 3 outputs"
    )
    assert out["batch"] == (
        "the training data has batches of 32 examples, the trainer a "
        "global batch of 64; its loss is scaled by the global batch, so "
        "give both the same size"
    )
    assert (
        out["lengths"] == "train_batches: x has 640 examples and y has 600; give as many "
        "labels as inputs"
    )
    assert out["ignore_255"] == out["mse_ints"] == out["hinge"] == "accepted"
