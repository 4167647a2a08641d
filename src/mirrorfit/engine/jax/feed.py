"""Training input for the JAX engine: blocks ``[S, B, ...]`` of global batches, copied to the
devices before the step that needs them.

A background thread builds each call's block in host memory while the devices compute; the
training thread copies the next block as it hands over the current one (double buffering).
Its wait for a block is the input wait. Arrays are gathered with NumPy in the TF engine's
seeded order, synthetic data is put once, anything else is read from its tf.data pipeline;
over several processes each puts only its share. (why: docs/architecture.md#jax-input-feed)
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
