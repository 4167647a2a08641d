"""mirrorfit.fit(checkpoint_dir=) as a user resumes it, on 2 replicas: a newest checkpoint with
one flipped exponent bit of a bias, or cut in half, is set aside with one warning and the one
before it restored, ending where an uninterrupted run ends; a model compiled with another
learning rate is refused by name. Run as ``python resume.py BACKEND DIR`` (DIR/result.json).
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import numpy as np

import mirrorfit

BACKEND, DIR = sys.argv[1], Path(sys.argv[2])
mirrorfit.setup(backend=BACKEND, replicas=2)
import h5py  # noqa: E402
import keras  # noqa: E402

rng = np.random.default_rng(0)
x = rng.normal(size=(256, 8)).astype("float32")
y = (x @ rng.normal(size=(8, 1))).astype("float32")
kw = dict(batch_size=32, verbose=0, shuffle=False)
out: dict = {}


def build(lr=0.01):
    keras.utils.set_random_seed(1)
    model = keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)]
    )
    model.compile(optimizer=keras.optimizers.Adam(lr), loss="mse")
    return model


def flip_a_bias_exponent(file: Path) -> None:
    """Bit 30 (the exponent's top) of the first float32 of a bias, in place."""
    with h5py.File(file, "r") as f:
        found = []
        f.visititems(lambda n, o: found.append(o.id.get_offset()) if n.endswith("vars/1") else None)
    offset = found[0]
    raw = bytearray(file.read_bytes())
    raw[offset + 3] ^= 0x40  # little-endian float32: byte 3 holds the sign and exponent
    file.write_bytes(bytes(raw))


def cut_in_half(file: Path) -> None:
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2])


whole = build()
mirrorfit.fit(whole, x, y, epochs=3, **kw)
for name, damage in (("flipped", flip_a_bias_exponent), ("cut", cut_in_half)):
    folder = DIR / name
    mirrorfit.fit(build(), x, y, epochs=2, checkpoint_dir=folder, **kw)
    damage(folder / "epoch-000002" / "state.weights.h5")
    resumed = build()
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        try:
            history = mirrorfit.fit(resumed, x, y, epochs=3, checkpoint_dir=folder, **kw)
            out[f"{name}_epochs_run"] = len(history.history["loss"])
        except ValueError as e:
            out[f"{name}_error"] = str(e)
    out[f"{name}_warnings"] = [str(w.message) for w in said if "cannot be read" in str(w.message)]
    out[f"{name}_equal_whole"] = all(
        np.array_equal(a, b) for a, b in zip(resumed.get_weights(), whole.get_weights())
    )
    out[f"{name}_folder"] = sorted(p.name for p in folder.iterdir())


# A LoRA layer (enable_lora): resumed from its epoch-2 checkpoint, it ends as 3 epochs in one
# go (Keras's save_weights merged the adapters into the kernel, and its load zeroed them).
def build_lora():
    keras.utils.set_random_seed(1)
    model = keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(1)]
    )
    model.layers[0].enable_lora(2)
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    return model


whole_lora = build_lora()
mirrorfit.fit(whole_lora, x, y, epochs=3, **kw)
mirrorfit.fit(build_lora(), x, y, epochs=2, checkpoint_dir=DIR / "lora", **kw)
resumed_lora = build_lora()
mirrorfit.fit(resumed_lora, x, y, epochs=3, checkpoint_dir=DIR / "lora", **kw)
out["lora_apart"] = max(
    float(np.max(np.abs(a - b)))
    for a, b in zip(resumed_lora.get_weights(), whole_lora.get_weights())
)
out["lora_files"] = sorted(p.name for p in (DIR / "lora" / "epoch-000003").iterdir())
for done in (DIR / "lora").glob("epoch-*"):  # as an earlier mirrorfit wrote them
    from mirrorfit.artifacts.checksums import sealed

    (done / "lora.npz").unlink()
    meta = json.loads((done / "meta.json").read_text())
    meta["files"].pop("lora.npz")
    (done / "meta.json").write_text(
        json.dumps(sealed({k: v for k, v in meta.items() if k != "crc"}))
    )
try:
    mirrorfit.fit(build_lora(), x, y, epochs=4, checkpoint_dir=DIR / "lora", **kw)
except ValueError as e:
    out["lora_without_file"] = str(e)

# Recompiled with another learning rate: refused by name (it used to train on at the old one).
try:
    mirrorfit.fit(build(lr=1e-4), x, y, epochs=4, checkpoint_dir=DIR / "flipped", **kw)
except ValueError as e:
    out["other_lr"] = str(e)

# Hand-made meta.json (resealed): a newer format is refused, not set aside; a nesting too deep
# for Python's JSON reader, or a generator state that is none, is damage: set aside.
from mirrorfit.artifacts.checksums import sealed  # noqa: E402


def edited(name: str, change) -> Path:
    folder = DIR / name
    mirrorfit.fit(build(), x, y, epochs=2, checkpoint_dir=folder, **kw)
    meta_file = folder / "epoch-000002" / "meta.json"
    change(meta_file, json.loads(meta_file.read_text()))
    return folder


def resumed_from(folder: Path) -> str:
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        try:
            mirrorfit.fit(build(), x, y, epochs=3, checkpoint_dir=folder, **kw)
        except ValueError as e:
            return f"refused: {e}"
    return " | ".join(str(w.message) for w in said if "cannot be read" in str(w.message))


newer = edited("newer", lambda f, m: f.write_text(json.dumps(sealed({**m, "format": 3}))))
out["newer"] = resumed_from(newer)
out["newer_kept"] = (newer / "epoch-000002").is_dir()
deep = edited("deep", lambda f, m: f.write_text("[" * 100_000 + "]" * 100_000))
out["deep"] = resumed_from(deep)
rng = edited("rng", lambda f, m: f.write_text(json.dumps(sealed({**m, "rng": "garbage"}))))
out["rng"] = resumed_from(rng)

# fresh=True in a call refused for another argument moves nothing aside.
try:
    mirrorfit.fit(build(), x, y, epochs=-1, checkpoint_dir=newer, fresh=True, **kw)
except ValueError:
    pass
out["fresh_refused_kept"] = (newer / "epoch-000002").is_dir()


# A checkpoint inside epoch 1 (step 6): a resume with another batch size is refused by name;
# one with initial_epoch=1 goes on inside epoch 1 (the checkpoint's position wins), and ends
# where the run never stopped ends.
class Crash(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if batch + 1 == 6:
            raise RuntimeError("crash")


inside = DIR / "inside"
try:
    mirrorfit.fit(
        build(),
        x,
        y,
        epochs=3,
        checkpoint_dir=inside,
        checkpoint_every=2,
        steps_per_execution=2,
        callbacks=[Crash()],
        **kw,
    )
except RuntimeError:
    pass
out["inside"] = sorted(p.name for p in inside.glob("epoch-*"))
try:
    mirrorfit.fit(build(), x, y, **{**kw, "batch_size": 64}, epochs=3, checkpoint_dir=inside)
except ValueError as e:
    out["inside_other_batch"] = str(e)
late = build()
history = mirrorfit.fit(
    late, x, y, epochs=3, initial_epoch=1, checkpoint_dir=inside, steps_per_execution=2, **kw
)
out["inside_epochs_run"] = len(history.history["loss"])
out["inside_equal_whole"] = all(
    np.array_equal(a, b) for a, b in zip(late.get_weights(), whole.get_weights())
)

# Targets past float32's range when squared, from the 3rd batch on (finite data: a NaN in
# it is refused before training): DivergedError after the first call whose loss is not
# finite, naming where and the newest checkpoint (none of non-finite weights is written);
# allow_nan=True trains on as Keras's fit does.
y_nan = y.copy()
y_nan[64:] = 1e30
for allow in (False, True):
    try:
        history = mirrorfit.fit(
            build(),
            x,
            y_nan,
            epochs=2,
            steps_per_execution=2,
            checkpoint_dir=DIR / f"nan-{allow}",
            checkpoint_every=2,
            allow_nan=allow,
            **kw,
        )
        out[f"nan_{allow}_epochs"] = len(history.history["loss"])
    except mirrorfit.DivergedError as e:
        out[f"nan_{allow}_error"] = str(e)
    out[f"nan_{allow}_checkpoints"] = sorted(p.name for p in (DIR / f"nan-{allow}").iterdir())
(DIR / "result.json").write_text(json.dumps(out))
