"""Run by tests/engine/jax/test_jax_sharded_checkpoints.py: ``python flipped_byte_driver.py
FOLDER``. Writes a small state to FOLDER with Orbax (engine.jax.orbax_state, TensorFlow
blocked), reads it back, flips one bit in the middle of its largest data chunk, and reads it
again. Prints one JSON line: whether the first read gave the array back whole, and what the
second read's ValueError said (null: it read)."""

import json
import sys

sys.modules["tensorflow"] = None

from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from mirrorfit.engine.jax import orbax_state as o  # noqa: E402

import jax  # noqa: E402

folder = Path(sys.argv[1])
tree = {
    "trainable": [np.arange(4096, dtype=np.float32)],
    "non_trainable": [],
    "optimizer": [np.ones(3, np.int32)],
}
w = o.async_checkpointer()
o.write(folder, tree, w).wait()
host = jax.sharding.SingleDeviceSharding(jax.devices()[0])
targets = {
    g: [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=host) for a in arrays]
    for g, arrays in tree.items()
}
back = np.asarray(o.read(folder, targets)["trainable"][0])
whole = bool((back == tree["trainable"][0]).all())
chunk = max(
    (p for p in (folder / "state").rglob("*") if p.is_file() and "/d/" in str(p)),
    key=lambda p: p.stat().st_size,
)
data = bytearray(chunk.read_bytes())
data[len(data) // 2] ^= 0x40
chunk.write_bytes(bytes(data))
try:
    o.read(folder, targets)
    said = None
except ValueError as e:
    said = str(e)
print(json.dumps({"whole": whole, "said": said}))
