"""Dynamic batching: concurrent requests for the same signature are merged into one model call
and the outputs split back, with TF Serving's knobs (``--batching_parameters_file``).

One queue per (model, version, signature, per-example shapes and dtypes); ``num_batch_threads``
threads per queue. A batch closes when it reaches ``max_batch_size`` examples or
``batch_timeout_micros`` after its oldest request arrived; it is padded up to the next
``allowed_batch_sizes`` entry. When ``max_enqueued_batches`` batches' worth of examples are
already waiting, a request is refused with UNAVAILABLE (HTTP 503).
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


@dataclass
class _Task:
    inputs: dict[str, np.ndarray]
    size: int
    future: Future | asyncio.Future = field(default_factory=Future)
    loop: asyncio.AbstractEventLoop | None = None  # set: ``future`` belongs to this loop
    enqueued: float = 0.0  # time.monotonic() when queued


class _Queue:
    def __init__(self, run: Run, params: BatchingParameters,
                 on_batch: Callable[[int, float], None]) -> None:
        self.run, self.params, self.on_batch = run, params, on_batch
        self.tasks: deque[_Task] = deque()
        self.pending = 0  # examples waiting
        self.cond = threading.Condition()
        self.closed = False
        self.threads = [threading.Thread(target=self._work, daemon=True, name="batch")
                        for _ in range(params.num_batch_threads)]
        for t in self.threads:
            t.start()

    def submit(self, task: _Task) -> None:
        p = self.params
        with self.cond:
            if self.pending + task.size > p.max_enqueued_batches * p.max_batch_size:
                raise ServingError(grpc.StatusCode.UNAVAILABLE,
                                   "The batch scheduling queue to which this task was submitted "
                                   "is full")
            task.enqueued = time.monotonic()
            self.tasks.append(task)
            self.pending += task.size
            # Wake a batch thread only when there is something new for it to do: the first
            # request (a thread may be idle) or a full batch; not a thread switch per request.
            if len(self.tasks) == 1 or self.pending - task.size < p.max_batch_size \
                    <= self.pending:
                self.cond.notify()

    def _take_batch(self) -> list[_Task]:
        """The next batch: once ``max_batch_size`` examples wait, or ``batch_timeout_micros``
        after the oldest waiting request arrived (as in TF Serving); [] once closed."""
        p = self.params
        with self.cond:
            while True:
                while not self.tasks and not self.closed:
                    self.cond.wait()
                if not self.tasks:
                    return []
                while self.tasks and self.pending < p.max_batch_size and not self.closed:
                    remaining = self.tasks[0].enqueued + p.batch_timeout_micros / 1e6 \
                        - time.monotonic()
                    if remaining <= 0:
                        break
                    self.cond.wait(remaining)
                batch, size = [], 0
                while self.tasks and size + self.tasks[0].size <= p.max_batch_size:
                    task = self.tasks.popleft()
                    self.pending -= task.size
                    batch.append(task)
                    size += task.size
                if self.tasks:  # the rest makes another batch: another thread may take it
                    self.cond.notify()
                if batch:  # (another thread may have taken them while this one waited)
                    return batch

    def _work(self) -> None:
        while True:
            batch = self._take_batch()
            if not batch:
                return
            self._run(batch)

    def _run(self, batch: list[_Task]) -> None:
        sizes = [t.size for t in batch]
        total = sum(sizes)
        padded = next((s for s in self.params.allowed_batch_sizes if s >= total), total)
        try:
            merged = {k: np.concatenate([t.inputs[k] for t in batch]) for k in batch[0].inputs}
            if padded > total:  # repeat the first example: any valid input does
                merged = {k: np.concatenate([v, np.repeat(v[:1], padded - total, axis=0)])
                          for k, v in merged.items()}
            t0 = time.perf_counter()
            outputs = self.run(merged)
            self.on_batch(padded, time.perf_counter() - t0)
        except BaseException as e:  # noqa: BLE001 - every waiting request gets the error
            _settle_all([(task, None, e) for task in batch])
            return
        settled, start = [], 0
        for task, n in zip(batch, sizes):
            settled.append((task, {k: v[start:start + n] for k, v in outputs.items()}, None))
            start += n
        _settle_all(settled)

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()


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


class Batcher:
    """Merge concurrent ``run`` calls into batches (see the module doc)."""

    def __init__(self, params: BatchingParameters,
                 on_batch: Callable[[str, int, float], None] = lambda model, size, s: None) \
            -> None:
        self.params = params
        self._on_batch = on_batch
        self._queues: dict[tuple, _Queue] = {}
        self._lock = threading.Lock()

    def run(self, key: tuple, model: str, run: Run, inputs: dict[str, np.ndarray],
            timeout_s: float | None = None) -> dict[str, np.ndarray]:
        """:meth:`submit`, then wait (at most ``timeout_s`` seconds) for the outputs."""
        future = self.submit(key, model, run, inputs)
        try:
            return future.result(timeout_s)
        except TimeoutError:
            raise ServingError(grpc.StatusCode.DEADLINE_EXCEEDED,
                               "Timed out waiting for the batch") from None

    def submit(self, key: tuple, model: str, run: Run, inputs: dict[str, np.ndarray],
               loop: asyncio.AbstractEventLoop | None = None) -> Future | asyncio.Future:
        """Queue ``inputs`` (every array batched on dim 0, equal sizes) to run through ``run``
        as part of a batch; the future gets this request's slice of the outputs. ``key``
        starts with (model, version). With ``loop``, the future is an asyncio future of that
        loop, to be awaited there."""
        sizes = {v.shape[0] for v in inputs.values()}
        if len(sizes) != 1:
            raise invalid("Batching session Run() input tensors must have equal 0th-dimension "
                          "size")
        size = sizes.pop()
        if size > self.params.max_batch_size:
            raise invalid(f"Task size {size} is larger than maximum input batch size "
                          f"{self.params.max_batch_size}")
        shape_key = tuple((k, v.shape[1:], v.dtype.str) for k, v in sorted(inputs.items()))
        queue = self._queue((*key, shape_key), model, run)
        task = (_Task(inputs=inputs, size=size) if loop is None else
                _Task(inputs=inputs, size=size, future=loop.create_future(), loop=loop))
        queue.submit(task)
        return task.future

    def _queue(self, key: tuple, model: str, run: Run) -> _Queue:
        with self._lock:
            queue = self._queues.get(key)
            if queue is None:
                queue = _Queue(run, self.params, lambda n, s: self._on_batch(model, n, s))
                self._queues[key] = queue
            return queue

    def forget(self, model: str, version: int) -> None:
        """Close the queues of an unloaded version (after their waiting batches run)."""
        with self._lock:
            for key in [k for k in self._queues if k[:2] == (model, version)]:
                self._queues.pop(key).close()

    def close(self) -> None:
        with self._lock:
            for queue in self._queues.values():
                queue.close()


__all__ = ["Batcher"]
