"""Training input for the JAX engine: blocks of global batches, on the devices before the step
that needs them.

The controller runs an epoch as calls of ``n = min(S, steps left)`` steps. :class:`Feed`
knows that plan, so a background thread builds each call's block ``[S, B, ...]`` in host memory
(the batches of the seeded order, ``xs[:n]`` real, the rest padding the step never reads)
while the devices compute, and the training thread starts copying the next block to the
devices (split along the batch axis; asynchronous on a GPU) as it hands over the current one:
one block on the devices ahead of the step, two in host memory (double buffering). The
background thread only touches host memory. The time the training thread waits for a block is
the input wait.

Sources, as :mod:`mirrorfit.data` opens them:

* arrays (MNIST, ``.npz``, a function's arrays): indices from the same (seed, epoch) order as
  the TensorFlow engine, gathered with NumPy; uint8 pixels travel as uint8 (scaled on the
  device), 4x less to copy;
* synthetic data: one batch, made once, put on the devices once and repeated;
* anything else (image folders, TFRecords, datasets): its tf.data pipeline, read as NumPy
  (TensorFlow must be installed for those, and decodes them as it does for the TF engine).

Over several processes (``--strategy multi-worker``) each process builds only worker w's
contiguous share of every global batch (the sources' ``worker``/``workers`` arguments, as on
TensorFlow) and puts it on its own devices as its piece of the global block
(``jax.make_array_from_process_local_data``): Keras's own multi-process input sharding takes
tf.data only.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Iterator

import numpy as np

from mirrorfit.errors import DataEndedError


def plan(
    *, steps_per_epoch: int, start_epoch: int, epochs: int, skip: int, steps_per_execution: int
) -> list[tuple[int, int, int]]:
    """(epoch, first step, steps) of every call the controller makes, in order."""
    out = []
    for epoch in range(start_epoch, epochs):
        at = skip if epoch == start_epoch else 0
        while at < steps_per_epoch:
            n = min(steps_per_execution, steps_per_epoch - at)
            out.append((epoch, at, n))
            at += n
    return out


class Feed:
    """The blocks of ``calls`` (see :func:`plan`) from ``source``, ``depth`` ahead of the
    training thread, as device arrays sharded by ``batch_sharding`` (batch axis 1). With
    ``workers`` > 1, this process reads worker ``worker``'s share of each global batch and
    ``placement`` (a :class:`~mirrorfit.engine.jax.placement.Placement`) makes it this
    process's piece of the global block."""

    def __init__(
        self,
        source,
        calls: list[tuple[int, int, int]],
        *,
        block_steps: int,
        batch_sharding,
        depth: int = 2,
        worker: int = 0,
        workers: int = 1,
        placement=None,
    ) -> None:
        self._calls = list(calls)
        self._sharding = batch_sharding
        self._workers, self._placement = workers, placement
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self.wait_s = 0.0  # seconds the training thread waited for input
        self._ahead = None  # (steps, device block) of the next call, already copying
        planned = list(calls)  # the thread's copy: next() pops from self._calls
        blocks = _host_blocks(source, planned, block_steps, worker, workers)
        if blocks is None:  # synthetic: one batch, on the devices once
            x, y = source.host_batch(worker, workers)
            self._fixed = self._put(x[None], y[None])
            self._thread = None
        else:
            self._fixed = None
            self._thread = threading.Thread(
                target=self._fill, args=(blocks, planned), name="mirrorfit-feed", daemon=True
            )
            self._thread.start()

    def _put(self, xs: np.ndarray, ys: np.ndarray):
        import jax

        if self._placement is None:
            return jax.device_put(xs, self._sharding), jax.device_put(ys, self._sharding)
        w = self._workers
        return tuple(
            self._placement.from_local(
                a, (a.shape[0], a.shape[1] * w, *a.shape[2:]), self._sharding
            )
            for a in (xs, ys)
        )

    def _fill(self, blocks: Iterator, calls: list) -> None:
        try:
            for (_, _, n), block in zip(calls, blocks):
                while not self._stop.is_set():
                    try:
                        self._queue.put((n, block), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if self._stop.is_set():
                    return
        except BaseException as e:  # handed to the training thread, which raises it
            self._queue.put((None, e))

    def _take(self):
        t0 = time.perf_counter()
        n, item = self._queue.get()
        self.wait_s += time.perf_counter() - t0
        if n is None:
            raise item
        return n, self._put(*item)

    def next(self, steps: int):
        """The device block for the next call of ``steps`` steps: (xs, ys)."""
        if self._fixed is not None:
            return self._fixed
        n, block = self._ahead if self._ahead is not None else self._take()
        self._ahead = self._take() if len(self._calls) > 1 else None
        self._calls.pop(0)
        if n != steps:
            raise RuntimeError(f"the feed planned {n} steps, the trainer asked for {steps}")
        return block

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


def _host_blocks(
    source, calls, block_steps: int, worker: int = 0, workers: int = 1
) -> Iterator | None:
    """NumPy blocks (xs, ys) for ``calls`` (worker ``worker``'s share of each global batch), or
    None for a source of one repeated batch."""
    if hasattr(source, "host_batch"):
        return None
    if hasattr(source, "epoch_batches") and hasattr(source, "x"):
        return _array_blocks(source, calls, block_steps, worker, workers)
    return _dataset_blocks(source, calls, block_steps, worker, workers)


def _array_blocks(source, calls, block_steps: int, worker: int, workers: int) -> Iterator:
    rows_of, rows = None, None
    for epoch, at, n in calls:
        if rows_of != epoch:
            rows_of, rows = epoch, source.epoch_batches(epoch, worker, workers)
        index = rows[at : at + n]
        xs = np.zeros((block_steps, *index.shape[1:], *source.x.shape[1:]), source.x.dtype)
        ys = np.zeros((block_steps, *index.shape[1:], *source.y.shape[1:]), np.int32)
        np.take(source.x, index, axis=0, out=xs[:n])
        ys[:n] = source.y[index]
        yield xs, ys


def _dataset_blocks(source, calls, block_steps: int, worker: int, workers: int) -> Iterator:
    if not calls:
        return
    first_epoch, skip, _ = calls[0]
    last_epoch = calls[-1][0] + 1
    shares = {"worker": worker, "workers": workers} if workers > 1 else {}
    batches = source.dataset(
        start_epoch=first_epoch, epochs=last_epoch, skip=skip, **shares
    ).as_numpy_iterator()
    for _, _, n in calls:
        try:
            taken = [next(batches) for _ in range(n)]
        except StopIteration:
            raise DataEndedError("the training data ended before the planned steps") from None
        x0, y0 = taken[0]
        xs = np.zeros((block_steps, *x0.shape), x0.dtype)
        ys = np.zeros((block_steps, *y0.shape), np.int32)
        for i, (x, y) in enumerate(taken):
            xs[i], ys[i] = x, y
        yield xs, ys


__all__ = ["Feed", "plan"]
