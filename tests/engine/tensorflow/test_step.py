"""engine.step: gradient accumulation, fp16 loss scaling and XLA, each under distribution.

Cases run in fresh interpreters with N logical CPU devices (set before TensorFlow starts).
"""

import numpy as np
import pytest

from conftest import run_isolated

# Runs on the same replica count share one interpreter (TensorFlow's start-up is most of a
# run's time); each builds its trainer afresh from the same seed.
ACCUM = """
import json, numpy as np, keras, mirrorfit
setup = mirrorfit.configure_devices(replicas={replicas})
strategy = mirrorfit.build_strategy(setup)
data = mirrorfit.load_mnist(train_examples=2048, download=False)
results = {{}}
for accum in {accums!r}:
    keras.utils.set_random_seed(7)
    trainer = mirrorfit.Trainer(strategy=strategy, model=mirrorfit.models.mlp,
                                optimizer=keras.optimizers.SGD(0.1),
                                loss=keras.losses.SparseCategoricalCrossentropy(),
                                global_batch=128, steps_per_execution=4, accum_steps=accum)
    history = trainer.fit(mirrorfit.train_batches(data.x_train, data.y_train, global_batch=128,
                                                  seed=3), epochs=2)
    np.savez(f"{out}/x{replicas}_accum{{accum}}.npz", *trainer.model.get_weights())
    results[f"x{replicas}_accum{{accum}}"] = {{
        "steps": history.steps, "micro": trainer.micro_batch,
        "iterations": int(trainer.optimizer.iterations.numpy()),
        "traced": trainer.tracing_count()}}
print(json.dumps(results))
"""


def _weights(path):
    with np.load(path) as f:
        return [f[k] for k in sorted(f.files, key=lambda k: int(k.split("_")[1]))]


@pytest.fixture(scope="module")
def accumulated(tmp_path_factory):
    """One step on the 128 batch (1 replica), and 4 accumulated micro-batches on 1 and on 2
    replicas: summaries by name, weights in ``out/NAME.npz``."""
    out = tmp_path_factory.mktemp("accum")
    results = run_isolated(ACCUM.format(replicas=1, accums=[1, 4], out=out))
    results.update(run_isolated(ACCUM.format(replicas=2, accums=[4], out=out)))
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


OVERFLOW = """
import json, numpy as np, tensorflow as tf, keras, mirrorfit
setup = mirrorfit.configure_devices(replicas=2)
strategy = mirrorfit.build_strategy(setup)
keras.utils.set_random_seed(0)
trainer = mirrorfit.Trainer(strategy=strategy, model=mirrorfit.models.mlp,
                            optimizer=keras.optimizers.SGD(0.1),
                            loss=keras.losses.SparseCategoricalCrossentropy(), global_batch=64,
                            precision="fp16")
rng = np.random.default_rng(0)
x = rng.uniform(0, 1, (64, 28, 28)).astype("float32")
y = rng.integers(0, 10, 64)
bad = x.copy()
bad[32:] = 3e4  # only the second replica's half overflows float16
def one_step(images):
    trainer.fit(tf.data.Dataset.from_tensor_slices((images, y)).batch(64),
                epochs=trainer.epoch + 1)
before = [w.copy() for w in trainer.model.get_weights()]
scale0 = trainer.loss_scale()
one_step(bad)
after_bad = trainer.model.get_weights()
state_bad = (trainer.loss_scale(), trainer.skipped_steps())
one_step(x)
changed = max(float(np.abs(a - b).max()) for a, b in zip(before, trainer.model.get_weights()))
print(json.dumps({
    "unchanged": all(np.array_equal(a, b) for a, b in zip(before, after_bad)),
    "finite": all(bool(np.isfinite(w).all()) for w in trainer.model.get_weights()),
    "scale0": scale0, "scale_bad": state_bad[0], "skipped_bad": state_bad[1],
    "skipped_end": trainer.skipped_steps(), "changed_after_good": changed,
    "compute": trainer.model.layers[1].compute_dtype,
    "output": trainer.model.layers[-1].compute_dtype}))
"""


@pytest.mark.slow
def test_fp16_overflow_on_one_replica_skips_the_step_and_lowers_the_scale():
    out = run_isolated(OVERFLOW)
    assert (out["compute"], out["output"]) == ("float16", "float32")
    assert out["unchanged"], "an overflowing step must leave every weight as it was"
    assert out["scale_bad"] == out["scale0"] / 2
    assert out["skipped_bad"] == 1
    assert out["finite"] and out["changed_after_good"] > 0  # the next good step applies
    assert out["skipped_end"] == 1


XLA = """
import json, numpy as np, keras, mirrorfit
setup = mirrorfit.configure_devices(replicas=2)
strategy = mirrorfit.build_strategy(setup)
data = mirrorfit.load_mnist(train_examples=1024, download=False)
keras.utils.set_random_seed(7)
notices = []
trainer = mirrorfit.Trainer(strategy=strategy, model={model}, optimizer=keras.optimizers.SGD(0.1),
                            loss=keras.losses.SparseCategoricalCrossentropy(), global_batch=64,
                            steps_per_execution=8, jit_compile={xla}, on_notice=notices.append)
history = trainer.fit(mirrorfit.train_batches(data.x_train, data.y_train, global_batch=64,
                                              seed=3), epochs=1)
np.savez("{out}", *trainer.model.get_weights())
print(json.dumps({{"xla": trainer.jit_compile, "notices": notices, "steps": history.steps}}))
"""


@pytest.mark.slow
def test_xla_gives_the_same_weights_as_no_xla(tmp_path):
    plain = run_isolated(XLA.format(model="mirrorfit.models.mlp", xla=False, out=tmp_path / "a"))
    xla = run_isolated(XLA.format(model="mirrorfit.models.mlp", xla=True, out=tmp_path / "b"))
    assert xla["xla"] and not plain["xla"] and xla["notices"] == []
    for a, b in zip(_weights(tmp_path / "a.npz"), _weights(tmp_path / "b.npz")):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-5)


@pytest.mark.slow
def test_a_model_xla_cannot_compile_gets_a_message_and_trains_without(tmp_path):
    out = run_isolated(
        XLA.format(
            model="__import__('user_models').not_xla_compilable", xla=True, out=tmp_path / "u"
        )
    )
    assert out["xla"] is False and out["steps"] == 1024 // 64
    assert len(out["notices"]) == 1
    assert out["notices"][0].startswith(
        "XLA cannot compile this model (unsupported operation(s): PyFunc)"
    )
    assert "training without --xla" in out["notices"][0]
