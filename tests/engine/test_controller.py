"""engine.controller (with the TF step and loop): data-parallel training that matches one device.

Training runs in fresh interpreters with N logical CPU devices (they must be set before
TensorFlow starts), one per replica count, and saves the trained weights for comparison here.
"""

import numpy as np
import pytest

from conftest import assert_same_weights, run_isolated, runs_by_replicas

# The runs of one replica count share one interpreter (TensorFlow's start-up is most of a
# run's time); each builds its strategy, model and optimizer afresh from the same seed, so a run
# gives the weights it would alone (the comparisons below would catch it if not).
TRAIN = """
import json, numpy as np, keras, mirrorfit
setup = mirrorfit.configure_devices(replicas={replicas})
data = mirrorfit.load_mnist(train_examples=2048, download=False)
results = {{}}
for name, kind, optimizer, spe in {runs!r}:
    strategy = mirrorfit.build_strategy(setup, kind=kind)
    keras.utils.set_random_seed(7)
    opt = {{"sgd": keras.optimizers.SGD(0.05), "adam": keras.optimizers.Adam(1e-3)}}[optimizer]
    trainer = mirrorfit.Trainer(strategy=strategy, model=mirrorfit.models.mlp, optimizer=opt,
                                loss=keras.losses.SparseCategoricalCrossentropy(),
                                global_batch=64, steps_per_execution=spe)
    init = [w.copy() for w in trainer.model.get_weights()]
    history = trainer.fit(mirrorfit.train_batches(data.x_train, data.y_train, global_batch=64,
                                                  seed=3), epochs=2)
    np.savez(f"{out}/{{name}}.npz", *trainer.model.get_weights())
    changed = max(float(np.abs(a - b).max()) for a, b in zip(init, trainer.model.get_weights()))
    test = trainer.evaluate((data.x_test[:3000], data.y_test[:3000]), batch_size=64)
    results[name] = {{"steps": history.steps, "traced": trainer.tracing_count(),
                      "changed": changed, "loss": history.epochs[-1]["loss"],
                      "accuracy": history.epochs[-1]["accuracy"], "test": test}}
print(json.dumps(results))
"""
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
    return runs_by_replicas(TRAIN, RUNS, tmp_path_factory.mktemp("weights"))


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


EVAL = """
import json, numpy as np, keras, mirrorfit
setup = mirrorfit.configure_devices(replicas=2)
strategy = mirrorfit.build_strategy(setup)
data = mirrorfit.load_mnist(train_examples=512, download=False)
trainer = mirrorfit.Trainer(strategy=strategy, model=mirrorfit.models.mlp,
                            optimizer=keras.optimizers.SGD(0.1),
                            loss=keras.losses.SparseCategoricalCrossentropy(), global_batch=64)
trainer.fit(mirrorfit.train_batches(data.x_train, data.y_train, global_batch=64, seed=0),
            epochs=1)
x, y = data.x_test[:1001], data.y_test[:1001]
result = trainer.evaluate((x, y), batch_size=64)
probs = trainer.model.predict(x / 255.0, verbose=0)
expected_acc = float(np.mean(np.argmax(probs, 1) == y))
expected_loss = float(np.mean(-np.log(probs[np.arange(len(y)), y])))
print(json.dumps({"result": result, "acc": expected_acc, "loss": expected_loss}))
"""


@pytest.mark.slow
def test_evaluation_counts_each_example_once_when_not_divisible():
    out = run_isolated(EVAL)
    assert out["result"]["examples"] == 1001  # 15 full batches of 64 + a partial one of 41
    assert out["result"]["accuracy"] == pytest.approx(out["acc"], abs=1e-6)
    assert out["result"]["loss"] == pytest.approx(out["loss"], rel=1e-4)


OUTSIDE = """
import json, keras, mirrorfit
setup = mirrorfit.configure_devices(replicas=2)
strategy = mirrorfit.build_strategy(setup)
model = mirrorfit.models.mlp()  # built outside strategy.scope()
try:
    mirrorfit.Trainer(strategy=strategy, model=model, optimizer=keras.optimizers.SGD(0.1),
                      loss=keras.losses.SparseCategoricalCrossentropy(), global_batch=64)
    print(json.dumps({"error": None}))
except mirrorfit.ConfigError as e:
    print(json.dumps({"error": str(e)}))
"""


@pytest.mark.slow
def test_model_built_outside_the_scope_is_refused_clearly():
    assert "not created under this strategy" in run_isolated(OUTSIDE)["error"]


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
REFUSALS = """
import json, os
os.environ["KERAS_BACKEND"] = "{backend}"
import numpy as np, keras, mirrorfit
from mirrorfit.engine import {backend} as engine
dist = engine.build_distribution(engine.configure_devices(replicas=2))
data = mirrorfit.load_mnist(train_examples=640, download=False)
x, y = data.x_train, data.y_train

def trainer(classes=10):
    return mirrorfit.Trainer(strategy=dist, optimizer=keras.optimizers.SGD(0.05),
                             model=lambda: mirrorfit.models.mlp(num_classes=classes),
                             loss=keras.losses.SparseCategoricalCrossentropy(), global_batch=64)

def batches(labels=y, batch=64):
    return mirrorfit.train_batches(x, labels, global_batch=batch, seed=1)

def legit(loss, labels, classes=4):
    # labels a sparse categorical loss skips, or that index nothing (MSE, hinge): trained
    t = mirrorfit.Trainer(strategy=dist, optimizer=keras.optimizers.SGD(0.01),
                          model=lambda: mirrorfit.models.mlp(num_classes=classes), loss=loss,
                          global_batch=64)
    t.fit(mirrorfit.train_batches(x, labels, global_batch=64, seed=1), epochs=1)
    t.evaluate((x[:100], labels[:100]))

t, t3 = trainer(), trainer(classes=3)
cases = {{
    "ignore_255": lambda: legit(keras.losses.SparseCategoricalCrossentropy(ignore_class=255),
                                np.where(y % 4 == 3, 255, y % 4).astype(np.uint8)),
    "mse_ints": lambda: legit(lambda a, b: keras.ops.mean(
        (keras.ops.cast(a, "float32")[:, None] - b) ** 2, axis=-1), y, classes=2),
    "hinge": lambda: legit(lambda a, b: keras.ops.mean(keras.ops.maximum(
        0.0, 1.0 - keras.ops.cast(a, "float32")[:, None] * b), axis=-1),
        np.where(y % 2, 1, -1), classes=2),
    "evaluate": lambda: t.evaluate((x[:100], y[:99])),
    "validation": lambda: t.fit(batches(), epochs=1, validation=(x[:100], y[:99])),
    "eval_labels": lambda: t.evaluate((x[:100], np.full(100, 99))),
    "train_labels": lambda: t3.fit(batches(), epochs=1),
    "batch": lambda: t.fit(batches(batch=32), epochs=1),
    "lengths": lambda: batches(labels=y[:600]),
}}
out = {{}}
for name, case in cases.items():
    try:
        case()
        out[name] = "accepted"
    except ValueError as e:
        out[name] = str(e)
print(json.dumps(out))
"""


@pytest.mark.parametrize("backend", ["jax", "tensorflow"])
def test_data_that_would_train_something_else_is_a_value_error(backend):
    out = run_isolated(REFUSALS.format(backend=backend))
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
