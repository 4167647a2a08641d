"""``mirrorfit.fit`` over several worker processes: every worker reads the same global batches and
trains its devices' shares, so the workers must agree on the data, and only one writes. NumPy's
global generator is set to the chief's at each ``fit``/``evaluate``; each block of batches is
checked against the other workers' (a CRC of its batches, one collective); Keras's writing callbacks
and the progress bar run on the chief only. (why: docs/architecture.md#fit-over-several-workers)
"""

from __future__ import annotations

import zlib
from typing import Iterable, Iterator

import numpy as np

from mirrorfit.errors import FitError

_END = (0, 0, 0, 0)  # a worker's data ran out
NONE = (1 << 24) - 1  # an argument given as None, among the settings the workers compare


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

    def start(self, refused: Exception | None, settings: dict[str, int]) -> None:
        """The first collective of a ``fit``/``evaluate``: raise ``refused`` (this worker's
        own error) on every worker, or a FitError if another worker refused or was called
        with other ``settings`` (small non-negative ints); then set NumPy's global generator
        to the chief's, so Keras's array shuffles draw what one process would have drawn."""
        if self.count == 1:
            if refused is not None:
                raise refused
            return
        state = _numpy_state()
        rows = self.distribution.gather([0 if refused is None else 1, *settings.values(), *state])
        if refused is not None:
            raise refused
        failed = [w for w, row in enumerate(rows) if row[0]]
        if failed:
            raise FitError(
                f"worker(s) {', '.join(map(str, failed))} refused this call (its log says "
                "why); stopped here too"
            )
        for i, name in enumerate(settings):
            column = [int(row[1 + i]) for row in rows]
            if len(set(column)) > 1:
                shown = ", ".join("None" if v == NONE else str(v) for v in column)
                raise FitError(
                    f"the workers were called with {name} [{shown}] (worker order); give "
                    "every worker the same arguments"
                )
        _set_numpy_state(rows[0][1 + len(settings) :])

    def agree(self, flag: bool) -> bool:
        """True on every worker if ``flag`` is on any (``model.stop_training``)."""
        return flag if self.count == 1 else bool(self.distribution.agree(bool(flag)))

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
        rows = [tuple(int(v) for v in row) for row in self.distribution.gather(list(mine))]
        differ = [w for w, row in enumerate(rows) if row != rows[0]]
        if not differ:
            return
        ended = [w for w, row in enumerate(rows) if row == _END]
        if ended:
            raise FitError(
                f"worker(s) {', '.join(map(str, ended))} ran out of data at block {index} of "
                "this epoch and the others did not; give every worker the same data (the "
                "global batches: each trains its share)"
            )
        raise FitError(
            f"worker(s) {', '.join(map(str, differ))} read other batches than worker 0 at "
            f"block {index} of this epoch; give every worker the same data in the same order "
            "(mirrorfit.fit gives NumPy's shuffles the chief's generator; seed a generator "
            "or tf.data shuffle of your own alike, or pass shuffle=False)"
        )


def _numpy_state() -> list[int]:
    """NumPy's global (legacy MT19937) generator as 16-bit ints: its 624 keys, the position,
    and the cached Gaussian (a flag and the float64's four parts)."""
    _, keys, pos, has_gauss, gauss = np.random.get_state()
    parts = [np.asarray(keys, np.uint32).view(np.uint16), np.asarray([gauss]).view(np.uint16)]
    return [*map(int, parts[0]), pos, has_gauss, *map(int, parts[1])]


def _set_numpy_state(values) -> None:
    """NumPy's global generator from :func:`_numpy_state`'s ints (the chief's)."""
    values = np.asarray(values, np.int64)
    keys = values[:1248].astype(np.uint16).view(np.uint32)
    gauss = float(values[1250:1254].astype(np.uint16).view(np.float64)[0])
    np.random.set_state(("MT19937", keys, int(values[1248]), int(values[1249]), gauss))


def fingerprint(data: dict, steps: int) -> tuple[int, int, int, int]:
    """``(1, steps, crc low, crc high)``: CRC-32 of every batch of a block that trains (leaves
    ``[S, B, ...]``), in 16-bit parts (the collectives carry small ints)."""
    from keras import tree

    crc = 0
    for leaf in tree.flatten(data):
        crc = zlib.crc32(memoryview(np.ascontiguousarray(np.asarray(leaf)[:steps])), crc)
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
