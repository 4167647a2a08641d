"""What the devices hold, for the JAX drivers beside this file (imported from a driver's own
folder): JAX's live arrays, each buffer once."""

from __future__ import annotations

import gc


def most_live_bytes() -> int:
    """The largest sum over one device of the live buffers it holds, each counted once: a
    split array's pieces, once read (``addressable_shards``' data), are live arrays of their
    own over the same buffers."""
    import jax

    gc.collect()  # what only a reference cycle holds is not held
    held: dict = {}
    for array in jax.live_arrays():
        for piece in array.addressable_shards:
            held[(piece.device, piece.data.unsafe_buffer_pointer())] = piece.data.nbytes
    per_device: dict = {}
    for (device, _), size in held.items():
        per_device[device] = per_device.get(device, 0) + size
    return max(per_device.values())
