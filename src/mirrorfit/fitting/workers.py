"""``mirrorfit.fit`` over several worker processes: every worker reads the same global batches and
trains its devices' shares, so the workers must agree on the data, and only one writes. NumPy's
global generator is seeded alike at each ``fit``/``evaluate``; each block of batches is checked
against the other workers' (a fingerprint per batch, one collective); Keras's writing callbacks
and the progress bar run on the chief only. (why: docs/architecture.md#fit-over-several-workers)
"""

from __future__ import annotations

import zlib
from typing import Iterable, Iterator

import numpy as np

from mirrorfit.errors import FitError

_END = (0, 0, 0, 0)  # a worker's data ran out


class Workers:
    """The workers a fit spans, from ``distribution`` (TensorFlow's ``Distribution`` or the
    JAX ``Placement``, as ``mirrorfit.setup`` made it; None: this process alone)."""

    def __init__(self, distribution) -> None:
        self.distribution = distribution

    @property
    def count(self) -> int:
        return getattr(self.distribution, "workers", 1)

    @property
    def is_chief(self) -> bool:
        return getattr(self.distribution, "is_chief", True)

    def seed_numpy(self) -> None:
        """Several workers: seed NumPy's global generator with the first worker's draw."""
        if self.count == 1:
            return
        drawn = np.random.randint(0, 1 << 16, size=2)
        first = self.distribution.gather([int(v) for v in drawn])[0]
        np.random.seed(int(first[0]) << 16 | int(first[1]))

    def on_this_worker(self, callbacks: list) -> list:
        """The callbacks this worker runs: off the chief, all but Keras's writers, and
        BackupAndRestore's restore only."""
        if self.is_chief:
            return callbacks
        import keras

        return [
            _restore_only(cb) if isinstance(cb, keras.callbacks.BackupAndRestore) else cb
            for cb in callbacks
            if not isinstance(cb, _writers())
        ]

    def same_epoch(self, epoch: int) -> int:
        """``epoch`` (where training starts), checked to be every worker's."""
        if self.count == 1:
            return epoch
        rows = self.distribution.gather([epoch & 0xFFFF, epoch >> 16])
        starts = [int(r[0]) | int(r[1]) << 16 for r in rows]
        if len(set(starts)) > 1:
            raise FitError(
                f"the workers would start at epochs {starts} (worker order): each restored "
                "another backup; give BackupAndRestore a directory every worker reads (a "
                "shared filesystem)"
            )
        return epoch

    def agreed(self, blocks: Iterable) -> Iterator:
        """``blocks`` as they come; several workers: each checked to be every worker's, and
        their ends to come together."""
        if self.count == 1:
            yield from blocks
            return
        index = 0
        for index, block in enumerate(blocks, 1):
            self._check(fingerprint(block.data, block.steps), index)
            yield block
        self._check(_END, index + 1)

    def _check(self, mine: tuple[int, ...], index: int) -> None:
        rows = self.distribution.gather(list(mine))
        differ = [w for w, row in enumerate(rows) if tuple(int(v) for v in row) != tuple(rows[0])]
        if not differ:
            return
        ended = [w for w, row in enumerate(rows) if tuple(int(v) for v in row) == _END]
        if ended:
            raise FitError(
                f"worker(s) {', '.join(map(str, ended))} ran out of data at block {index} of "
                "this epoch and the others did not; give every worker the same data (the "
                "global batches: each trains its share)"
            )
        raise FitError(
            f"worker(s) {', '.join(map(str, differ))} read other batches than worker 0 at "
            f"block {index} of this epoch; give every worker the same data in the same order "
            "(mirrorfit.fit seeds NumPy's shuffles alike; seed a generator or tf.data shuffle "
            "of your own alike, or pass shuffle=False)"
        )


def fingerprint(data: dict, steps: int) -> tuple[int, int, int, int]:
    """``(1, steps, crc low, crc high)``: CRC-32 of the first and last example of every batch
    of a block (leaves ``[S, B, ...]``), 16-bit parts (the collectives carry small ints)."""
    from keras import tree

    crc = 0
    for leaf in tree.flatten(data):
        a = np.asarray(leaf)
        if a.ndim >= 2 and a.shape[1]:
            crc = zlib.crc32(np.ascontiguousarray(a[:steps, [0, -1]]).tobytes(), crc)
    return (1, steps, crc & 0xFFFF, crc >> 16)


def _restore_only(backup):
    """A worker's view of Keras's BackupAndRestore: its restore at ``on_train_begin``, not its
    saves (the chief's) or its deletion at the end."""
    import keras

    class RestoreOnly(keras.callbacks.Callback):
        def set_model(self, model):
            super().set_model(model)
            backup.set_model(model)

        def on_train_begin(self, logs=None):
            backup.on_train_begin(logs)

    return RestoreOnly()


def _writers() -> tuple[type, ...]:
    import keras

    c = keras.callbacks
    return (c.ModelCheckpoint, c.CSVLogger, c.TensorBoard, c.RemoteMonitor)
