"""Padded global batches grouped into blocks of up to S (one compiled call each), built on a
background thread while the devices run the previous block."""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Iterable, Iterator

import numpy as np

from mirrorfit.fitting.batches import real_examples, signature


@dataclass(frozen=True)
class Block:
    """``steps`` batches stacked (leaves ``[S, B, ...]``; rows past ``steps`` repeat the last
    batch and are never run) and the real examples they hold."""

    data: dict
    steps: int
    examples: int


def blocks(batches: Iterable[dict], size: int) -> Iterator[Block]:
    """Consecutive batches of one signature, up to ``size`` a block, padded to ``size``."""
    from keras import tree

    pending: list[dict] = []
    for batch in batches:
        if pending and (len(pending) == size or signature(batch) != signature(pending[0])):
            yield _stack(pending, size, tree)
            pending = []
        pending.append(batch)
    if pending:
        yield _stack(pending, size, tree)


def _stack(pending: list[dict], size: int, tree) -> Block:
    filled = pending + [pending[-1]] * (size - len(pending))
    data = tree.map_structure(lambda *leaves: np.stack(leaves), *filled)
    return Block(data=data, steps=len(pending), examples=sum(map(real_examples, pending)))


_END = object()


def prefetched(items: Iterable, depth: int = 2) -> Iterator:
    """``items`` made on a daemon thread, ``depth`` ahead; its exception re-raised here."""
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce():
        try:
            for item in items:
                while not stop.is_set():
                    try:
                        q.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            q.put(_END)
        except BaseException as e:  # noqa: BLE001 - handed to the consumer
            q.put(e)

    thread = threading.Thread(target=produce, daemon=True, name="mirrorfit-input")
    thread.start()
    try:
        while True:
            item = q.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
