"""``mirrorfit.fit(checkpoint_dir=)`` of a state split over 2 JAX devices (``shard="all"``):
Orbax's ``state/``, damaged and resumed, and read by other runs. Run as ``python
split_resume.py BACKEND DIR MODE`` (DIR/result-MODE.json), MODE one of (BACKEND: jax, but
tensorflow for the last):

- ``all``: 3 epochs whole (DIR/whole.npz); 2 epochs into DIR/flipped with one byte of the
  newest checkpoint's array data flipped, then resumed to 3 (set aside, the one before used);
  2 epochs into DIR/cross and DIR/cross2 for the other modes;
- ``optimizer``: DIR/cross resumed to 3 epochs with the optimizer's state split alone
  (DIR/optimizer.npz), and its own 2 epochs in DIR/own resumed to 3 (DIR/own.npz);
- ``none``: DIR/cross2 resumed to 3 epochs with the state whole (``shard="none"``);
- ``tensorflow``: DIR/cross resumed on TensorFlow: refused in one line.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import numpy as np

import mirrorfit

BACKEND, DIR, MODE = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
mirrorfit.setup(
    backend=BACKEND,
    replicas=2,
    **({"shard": MODE} if MODE != "tensorflow" else {}),
)
import keras  # noqa: E402

rng = np.random.default_rng(0)
x = rng.normal(size=(256, 8)).astype("float32")
y = (x @ rng.normal(size=(8, 1))).astype("float32")
kw = dict(batch_size=32, verbose=0, shuffle=True)
out: dict = {}


def build():
    keras.utils.set_random_seed(1)
    model = keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(256, activation="tanh"), keras.layers.Dense(1)]
    )
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    return model


def resumed(folder: Path):
    model = build()
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        history = mirrorfit.fit(model, x, y, epochs=3, checkpoint_dir=folder, **kw)
    out["warnings"] = [str(w.message) for w in said if "cannot be read" in str(w.message)]
    out["epochs_run"] = len(history.history["loss"])
    return model


if MODE == "all":
    whole = build()
    mirrorfit.fit(whole, x, y, epochs=3, **kw)
    np.savez(DIR / "whole.npz", *whole.get_weights())
    folder = DIR / "flipped"
    mirrorfit.fit(build(), x, y, epochs=2, checkpoint_dir=folder, **kw)
    newest = folder / "epoch-000002"
    out["files"] = sorted(p.name for p in newest.iterdir())
    largest = max(
        (p for p in (newest / "state").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size
    )
    raw = bytearray(largest.read_bytes())
    raw[len(raw) // 2] ^= 0x40
    largest.write_bytes(bytes(raw))
    model = resumed(folder)
    out["equal_whole"] = all(
        np.array_equal(a, b) for a, b in zip(model.get_weights(), whole.get_weights())
    )
    out["folder"] = sorted(p.name for p in folder.iterdir())
    for name in ("cross", "cross2"):
        mirrorfit.fit(build(), x, y, epochs=2, checkpoint_dir=DIR / name, **kw)
elif MODE == "optimizer":
    np.savez(DIR / "optimizer.npz", *resumed(DIR / "cross").get_weights())
    mirrorfit.fit(build(), x, y, epochs=2, checkpoint_dir=DIR / "own", **kw)
    np.savez(DIR / "own.npz", *resumed(DIR / "own").get_weights())
elif MODE == "none":
    model = resumed(DIR / "cross2")
    np.savez(DIR / "none.npz", *model.get_weights())
else:
    try:
        mirrorfit.fit(build(), x, y, epochs=3, checkpoint_dir=DIR / "cross", **kw)
    except ValueError as e:
        out["refused"] = str(e)
(DIR / f"result-{MODE}.json").write_text(json.dumps(out))
