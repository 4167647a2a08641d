"""Dynamic batching: concurrent requests for the same signature are merged into one model call
and the outputs split back, with TF Serving's knobs (``--batching_parameters_file``). One
queue per (model, version, signature, per-example shapes and dtypes), capped at
``max_queues``, all served by one pool of ``num_batch_threads`` threads; a batch closes at
``max_batch_size`` examples or ``batch_timeout_micros`` (µs) after its oldest request, padded
to the next ``allowed_batch_sizes``. (why: docs/architecture.md#serving)
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import defaultdict, deque
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Callable

import grpc
import numpy as np

from mirrorfit.serving.errors import ServingError, invalid
from mirrorfit.serving.model_config import BatchingParameters

Run = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]

# Far more than the signatures a server has (one queue each, unless an input has a variable
# non-batch dimension: then one per length in use); small enough that scanning them per batch
# costs microseconds.
MAX_QUEUES = 64
IDLE_QUEUE_S = 60.0


@dataclass
class _Task:
    inputs: dict[str, np.ndarray]
    size: int
    future: Future | asyncio.Future = field(default_factory=Future)
    loop: asyncio.AbstractEventLoop | None = None  # set: ``future`` belongs to this loop
    enqueued: float = 0.0  # time.monotonic() when queued


@dataclass
class _Queue:
    """The requests waiting for one kind of batch; guarded by the batcher's condition."""

    model: str
    run: Run
    tasks: deque = field(default_factory=deque)
    pending: int = 0  # examples waiting
    used: float = 0.0  # time.monotonic() of the last submit
    draining: bool = False  # its version was unloaded: run what waits, take nothing new

    def take(self, max_size: int) -> list[_Task]:
        batch, size = [], 0
        while self.tasks and size + self.tasks[0].size <= max_size:
            task = self.tasks.popleft()
            self.pending -= task.size
            batch.append(task)
            size += task.size
        return batch


class Batcher:
    """Merge concurrent ``run`` calls into batches (see the module doc)."""

    def __init__(
        self,
        params: BatchingParameters,
        on_batch: Callable[[str, int, float], None] = lambda model, size, s: None,
        *,
        max_queues: int = MAX_QUEUES,
        idle_queue_s: float = IDLE_QUEUE_S,
    ) -> None:
        self.params = params
        self._on_batch = on_batch
        self._max_queues, self._idle_s = max_queues, idle_queue_s
        self._queues: dict[tuple, _Queue] = {}
        self._draining: list[_Queue] = []  # unloaded versions' queues until they are empty
        self._cond = threading.Condition()
        self._threads: list[threading.Thread] = []  # started with the first queue
        self._closed = False

    @property
    def queue_count(self) -> int:
        with self._cond:
            return len(self._queues) + len(self._draining)

    @property
    def thread_count(self) -> int:
        return len(self._threads)

    def run(
        self,
        key: tuple,
        model: str,
        run: Run,
        inputs: dict[str, np.ndarray],
        timeout_s: float | None = None,
    ) -> dict[str, np.ndarray]:
        """:meth:`submit`, then wait (at most ``timeout_s`` seconds) for the outputs."""
        future = self.submit(key, model, run, inputs)
        try:
            return future.result(timeout_s)
        except TimeoutError:
            raise ServingError(
                grpc.StatusCode.DEADLINE_EXCEEDED, "Timed out waiting for the batch"
            ) from None

    def submit(
        self,
        key: tuple,
        model: str,
        run: Run,
        inputs: dict[str, np.ndarray],
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> Future | asyncio.Future:
        """Queue ``inputs`` (every array batched on dim 0, equal sizes, already checked
        against the signature) to run through ``run`` as part of a batch; the future gets
        this request's slice of the outputs. ``key`` starts with (model, version). With
        ``loop``, the future is an asyncio future of that loop, to be awaited there."""
        sizes = {v.shape[0] for v in inputs.values()}
        if len(sizes) != 1:
            raise invalid("Batching session Run() input tensors must have equal 0th-dimension size")
        size = sizes.pop()
        p = self.params
        if size > p.max_batch_size:
            raise invalid(
                f"Task size {size} is larger than maximum input batch size {p.max_batch_size}"
            )
        shape_key = tuple((k, v.shape[1:], v.dtype.str) for k, v in sorted(inputs.items()))
        task = (
            _Task(inputs=inputs, size=size)
            if loop is None
            else _Task(inputs=inputs, size=size, future=loop.create_future(), loop=loop)
        )
        with self._cond:
            if self._closed:
                raise ServingError(grpc.StatusCode.UNAVAILABLE, "The server is shutting down")
            queue = self._queue((*key, shape_key), model, run)
            if queue.pending + size > p.max_enqueued_batches * p.max_batch_size:
                raise ServingError(
                    grpc.StatusCode.UNAVAILABLE,
                    "The batch scheduling queue to which this task was submitted is full",
                )
            task.enqueued = queue.used = time.monotonic()
            queue.tasks.append(task)
            queue.pending += size
            # Wake a batch thread only when there is something new for it to do: a queue's
            # first request (its timer must start) or a full batch; not one per request.
            if len(queue.tasks) == 1 or queue.pending - size < p.max_batch_size <= queue.pending:
                self._cond.notify()
        return task.future

    def _queue(self, key: tuple, model: str, run: Run) -> _Queue:
        """The queue for ``key``, made if need be within the bound (caller holds the lock)."""
        queue = self._queues.get(key)
        if queue is not None:
            return queue
        now = time.monotonic()
        for k, q in list(self._queues.items()):
            if not q.tasks and now - q.used >= self._idle_s:
                del self._queues[k]
        if len(self._queues) >= self._max_queues:  # drop the least recently used empty one
            empty = [k for k, q in self._queues.items() if not q.tasks]
            if not empty:
                raise ServingError(
                    grpc.StatusCode.UNAVAILABLE,
                    f"Too many batch queues in use ({self._max_queues}); retry later",
                )
            del self._queues[min(empty, key=lambda k: self._queues[k].used)]
        queue = self._queues[key] = _Queue(model, run)
        if not self._threads:
            self._threads = [
                threading.Thread(target=self._work, daemon=True, name="batch")
                for _ in range(self.params.num_batch_threads)
            ]
            for t in self._threads:
                t.start()
        return queue

    def _take_batch(self) -> tuple[_Queue | None, list[_Task]]:
        """The next batch of any queue: the one whose oldest request waited longest among
        those with ``max_batch_size`` examples waiting or ``batch_timeout_micros`` gone since
        their oldest request arrived (as in TF Serving); (None, []) once closed and empty."""
        p = self.params
        timeout = p.batch_timeout_micros / 1e6
        with self._cond:
            while True:
                now = time.monotonic()
                best, wake_at, waiting = None, None, 0
                for queue in (*self._queues.values(), *self._draining):
                    if not queue.tasks:
                        continue
                    waiting += 1  # queues with requests
                    due = queue.tasks[0].enqueued + timeout
                    if (
                        queue.pending >= p.max_batch_size
                        or due <= now
                        or queue.draining
                        or self._closed
                    ):
                        if best is None or queue.tasks[0].enqueued < best.tasks[0].enqueued:
                            best = queue
                    elif wake_at is None or due < wake_at:
                        wake_at = due
                self._draining = [q for q in self._draining if q.tasks]
                if best is not None:
                    batch = best.take(p.max_batch_size)
                    if best.draining and not best.tasks:
                        self._draining.remove(best)
                    if best.tasks or waiting > 1:  # more waits: another thread may take it
                        self._cond.notify()  # or start its timer
                    return best, batch
                if self._closed:
                    return None, []
                self._cond.wait(None if wake_at is None else wake_at - now)

    def _work(self) -> None:
        while True:
            queue, batch = self._take_batch()
            if queue is None:
                return
            self._run(queue, batch)

    def _run(self, queue: _Queue, batch: list[_Task]) -> None:
        sizes = [t.size for t in batch]
        total = sum(sizes)
        padded = next((s for s in self.params.allowed_batch_sizes if s >= total), total)
        try:
            merged = {k: np.concatenate([t.inputs[k] for t in batch]) for k in batch[0].inputs}
            if padded > total:  # repeat the first example: any valid input does
                merged = {
                    k: np.concatenate([v, np.repeat(v[:1], padded - total, axis=0)])
                    for k, v in merged.items()
                }
            t0 = time.perf_counter()
            outputs = queue.run(merged)
            self._on_batch(queue.model, padded, time.perf_counter() - t0)
        except BaseException as e:  # noqa: BLE001 - every waiting request gets the error
            _settle_all([(task, None, e) for task in batch])
            return
        settled, start = [], 0
        for task, n in zip(batch, sizes):
            settled.append((task, {k: v[start : start + n] for k, v in outputs.items()}, None))
            start += n
        _settle_all(settled)

    def forget(self, model: str, version: int) -> None:
        """Drop the queues of an unloaded version (after their waiting batches run)."""
        with self._cond:
            for key in [k for k in self._queues if k[:2] == (model, version)]:
                queue = self._queues.pop(key)
                queue.draining = True
                self._draining.append(queue)
            self._cond.notify_all()

    def close(self) -> None:
        """Run what waits, then stop the threads; later submits are refused."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()


def _settle_all(settled: list[tuple[_Task, dict | None, BaseException | None]]) -> None:
    """Give each task its result or error. Tasks waited on from an event loop are settled
    with one wake-up of that loop per batch, not one per request (each wake-up is a write to
    the loop's self-pipe and a turn of the loop, taken from the cores the model needs)."""
    by_loop = defaultdict(list)
    for task, result, error in settled:
        if task.loop is None:
            _settle(task.future, result, error)
        else:
            by_loop[task.loop].append((task.future, result, error))
    for loop, items in by_loop.items():
        try:
            loop.call_soon_threadsafe(_settle_each, items)
        except RuntimeError:  # the loop has closed: nobody waits any more
            pass


def _settle_each(items: list) -> None:
    for future, result, error in items:
        _settle(future, result, error)


def _settle(future, result, error: BaseException | None) -> None:
    if future.done():  # a client that timed out cancelled its future: nobody waits for it
        return
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
    except InvalidStateError:  # cancelled between the check and the set (another thread)
        pass


__all__ = ["Batcher", "MAX_QUEUES", "IDLE_QUEUE_S"]
