"""A KerasHub causal LM (Gemma, built from its config with random weights: 2 layers, hidden
128, vocabulary 1,024) with LoRA (rank 4), fine-tuned on random token sequences on 4 logical
CPU devices, as MODE says: ``mirrorfit.fit`` under ``mirrorfit.setup(backend="jax",
replicas=4)`` with ``shard`` ``none`` or ``all``, or ``model_parallel=2`` (``grid``: 2 x 2);
or Keras's own ``fit`` under ``keras.distribution.ModelParallel`` with the backbone's
``get_layout_map`` on a 2 x 2 mesh (``keras-mp``); ``grid-optimizer`` / ``grid-all``: the mesh with
ZeRO over its data axis. Run as ``python hub_lm.py MODE OUT
[EXAMPLES EPOCHS OPTIMIZER]``; writes OUT.json (history, steady examples/s over every epoch
but the first, the largest live bytes one device holds after fit, how many weights are
split) and OUT.npz (the weights). tests/engine/jax/test_jax_mesh.py and benchmarks/hub_lm.py use
it."""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

MODE, OUT = sys.argv[1], sys.argv[2]
EXAMPLES, EPOCHS = (int(a) for a in sys.argv[3:5]) if len(sys.argv) > 4 else (96, 2)
OPTIMIZER = sys.argv[5] if len(sys.argv) > 5 else "sgd"
if MODE == "keras-mp":
    os.environ["KERAS_BACKEND"] = "jax"
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
else:
    import mirrorfit

    kwargs = {
        "all": {"shard": "all"},
        "grid": {"model_parallel": 2},
        "grid-optimizer": {"model_parallel": 2, "shard": "optimizer"},
        "grid-all": {"model_parallel": 2, "shard": "all"},
    }.get(MODE, {})
    mirrorfit.setup(backend="jax", replicas=4, **kwargs)
import jax  # noqa: E402
import keras  # noqa: E402
from device_bytes import most_live_bytes  # noqa: E402 (beside this file)
import keras_hub  # noqa: E402

if MODE == "keras-mp":
    mesh = keras.distribution.DeviceMesh((2, 2), ("batch", "model"), jax.devices()[:4])
    layouts = keras_hub.models.GemmaBackbone.get_layout_map(mesh)
    keras.distribution.set_distribution(keras.distribution.ModelParallel(layout_map=layouts))


class Clock(keras.callbacks.Callback):
    """Examples per second over every epoch but the first (which compiles)."""

    def on_train_begin(self, logs=None):
        self.times: list = []

    def on_epoch_end(self, epoch, logs=None):
        self.times.append(time.perf_counter())

    def rate(self) -> float:
        return EXAMPLES * (len(self.times) - 1) / (self.times[-1] - self.times[0])


keras.utils.set_random_seed(0)
backbone = keras_hub.models.GemmaBackbone(
    vocabulary_size=1024,
    num_layers=2,
    num_query_heads=4,
    num_key_value_heads=2,
    hidden_dim=128,
    intermediate_dim=256,
    head_dim=32,
)
lm = keras_hub.models.GemmaCausalLM(backbone=backbone, preprocessor=None)
backbone.enable_lora(rank=4)
optimizer = keras.optimizers.SGD(0.5) if OPTIMIZER == "sgd" else keras.optimizers.AdamW(1e-3)
lm.compile(
    optimizer=optimizer,
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    weighted_metrics=["accuracy"],
)
rng = np.random.default_rng(0)
tokens = rng.integers(1, 1024, (EXAMPLES, 33)).astype("int32")
x = {"token_ids": tokens[:, :-1], "padding_mask": np.ones((EXAMPLES, 32), bool)}
y = tokens[:, 1:]
clock = Clock()
fit = lm.fit if MODE == "keras-mp" else lambda *a, **k: mirrorfit.fit(lm, *a, **k)
history = fit(x, y, batch_size=16, epochs=EPOCHS, verbose=0, shuffle=False, callbacks=[clock])
split = sum(
    1 for v in lm.weights if max(s.data.size for s in v.value.addressable_shards) < v.value.size
)
with open(OUT + ".json", "w") as f:
    json.dump(
        {
            "history": history.history,
            "examples_per_sec": clock.rate() if EPOCHS > 1 else None,
            "live_bytes": most_live_bytes(),
            "split": split,
            "trainable": len(lm.trainable_weights),
        },
        f,
    )
np.savez(OUT + ".npz", *[np.asarray(w) for w in lm.get_weights()])
