"""Batches grouped into blocks of up to S (one compiled call each), built on a background
thread while the devices run the previous block."""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from typing import Iterable, Iterator

import numpy as np

from mirrorfit.fitting.batches import nbytes, signature

BLOCK_BYTES = 64 << 20  # a block's host memory: at most this, or one batch


@dataclass(frozen=True)
class Block:
    """``steps`` batches stacked (leaves ``[S, B, ...]``; rows past ``steps`` repeat the last
    batch, so every block of a run has one shape, and are never run)."""

    data: dict
    steps: int


def blocks(batches: Iterable[dict], size: int) -> Iterator[Block]:
    """Consecutive batches of one signature, up to ``size`` a block (fewer where that many
    would hold more than :data:`BLOCK_BYTES`), each padded to the block's size."""
    from keras import tree

    pending: list[dict] = []
    for batch in batches:
        if not pending:
            size = max(1, min(size, BLOCK_BYTES // max(1, nbytes(batch))))
        elif len(pending) == size or signature(batch) != signature(pending[0]):
            yield _stack(pending, size, tree)
            pending = []
        pending.append(batch)
    if pending:
        yield _stack(pending, size, tree)


def _stack(pending: list[dict], size: int, tree) -> Block:
    filled = pending + [pending[-1]] * (size - len(pending))
    return Block(
        data=tree.map_structure(lambda *leaves: np.stack(leaves), *filled), steps=len(pending)
    )


_END = object()


def prefetched(items: Iterable, depth: int = 2, on_wait=None) -> Iterator:
    """``items`` made on a daemon thread, ``depth`` ahead; its exception re-raised here. The
    thread ends when the consumer stops early (its queue is never left blocking).
    ``on_wait(seconds)``: told how long the consumer waited for each item."""
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce():
        try:
            for item in items:
                if not put(item):
                    return
            put(_END)
        except BaseException as e:  # noqa: BLE001 - handed to the consumer
            put(e)

    thread = threading.Thread(target=produce, daemon=True, name="mirrorfit-input")
    thread.start()
    try:
        while True:
            began = time.perf_counter()
            item = q.get()
            if on_wait is not None:
                on_wait(time.perf_counter() - began)
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
