"""Sharded JAX checkpoints through Orbax: ``state/``, one Orbax PyTree of the trainable weights,
the statistics and the optimizer variables as the devices hold them, each process writing its
own pieces in the background; a restore re-shards on read. The commit point stays
:class:`~mirrorfit.artifacts.checkpoint.Checkpointer`'s rename. (why: docs/jax.md#checkpoints)
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import time
from pathlib import Path
from typing import Iterator

import numpy as np

from mirrorfit.artifacts.checkpoint_meta import StructureError
from mirrorfit.engine.jax.placement import local_value

ITEM = "state"  # the Orbax folder inside a checkpoint
GROUPS = ("trainable", "non_trainable", "optimizer")


class Background:
    """A save whose files are still being written; :meth:`wait` returns once every process's
    are complete on disk, and raises what failed."""

    def __init__(self, checkpointer) -> None:
        self._checkpointer = checkpointer

    def wait(self) -> None:
        self._checkpointer.wait_until_finished()


def async_checkpointer():
    import orbax.checkpoint as ocp

    # Orbax logs a failed background write (a full disk) with its tracebacks, several times,
    # through absl; the Checkpointer says it in one line.
    logging.getLogger("absl").addFilter(_not_orbax)
    return ocp.AsyncCheckpointer(ocp.StandardCheckpointHandler())


def _not_orbax(record: logging.LogRecord) -> bool:
    return f"{os.sep}orbax{os.sep}" not in record.pathname


def _item(folder: Path) -> Path:
    """Orbax's folder inside a checkpoint folder, as an absolute path (Orbax refuses a
    relative one: a relative --checkpoint-dir trained, then failed at its first save)."""
    return Path(folder).absolute() / ITEM


def write(folder: Path, tree: dict[str, list], checkpointer) -> Background:
    """Start writing ``tree`` (GROUPS -> device or host arrays) into ``folder/state``, and its
    checksums into ``folder/checksums.json`` (Orbax checks none: a flipped byte would restore
    silently). Returns once the arrays are copied off the devices."""
    import jax
    import orbax.checkpoint as ocp

    sums = checksums(tree)
    if jax.process_index() == 0:
        (folder / SUMS).write_text(json.dumps(sums))
    checkpointer.save(_item(folder), args=ocp.args.StandardSave(tree))
    return Background(checkpointer)


SUMS = "checksums.json"


def checksums(tree: dict[str, list]) -> dict[str, list[list[int]]]:
    """Each array's two sums over its bytes as 32-bit words w, modulo 2**32: of w and of
    w * (w | 1). They do not depend on the order of the words, so not on the sharding either:
    a split array is summed where its pieces are (several processes: a collective), a
    replicated one on one device (not once per device)."""
    flat = [(g, i, a) for g in GROUPS for i, a in enumerate(tree[g])]
    whole = [
        a.addressable_data(0) if hasattr(a, "addressable_data") else a
        for _, _, a in flat
        if _replicated(a)
    ]
    split = [a for _, _, a in flat if not _replicated(a)]
    sums_whole, sums_split = iter(_summer()(whole)), iter(_summer()(split))
    out: dict[str, list[list[int]]] = {g: [] for g in GROUPS}
    for g, _, a in flat:
        pair = next(sums_whole if _replicated(a) else sums_split)
        out[g].append([int(local_value(v)) for v in pair])
    return out


def _replicated(a) -> bool:
    return not hasattr(a, "sharding") or a.sharding.is_fully_replicated


@functools.cache
def _summer():
    import jax
    import jax.numpy as jnp

    def words(a):
        a = jnp.asarray(a)
        if a.dtype == jnp.bool_:
            a = a.astype(jnp.uint8)
        if a.dtype.itemsize == 8:
            return jax.lax.bitcast_convert_type(a, jnp.uint32).reshape(-1)
        kind = {4: jnp.uint32, 2: jnp.uint16, 1: jnp.uint8}[a.dtype.itemsize]
        return jax.lax.bitcast_convert_type(a, kind).astype(jnp.uint32).reshape(-1)

    def pair(a):
        w = words(a)
        return [jnp.sum(w, dtype=jnp.uint32), jnp.sum(w * (w | 1), dtype=jnp.uint32)]

    return jax.jit(lambda arrays: [pair(a) for a in arrays])


def check_sums(folder: Path, tree: dict[str, list]) -> None:
    """ValueError naming the first array of ``tree`` (restored from ``folder``) whose sums
    differ from those saved beside it: damaged data that Orbax read without an error."""
    try:
        saved = json.loads((folder / SUMS).read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{SUMS} cannot be read ({type(e).__name__})") from None
    got = checksums(tree)
    for group in GROUPS:
        if not isinstance(saved, dict) or len(saved.get(group, [])) != len(got[group]):
            raise ValueError(f"{SUMS} does not list the {group} arrays")
        for i, (want, have) in enumerate(zip(saved[group], got[group])):
            if list(want) != have:
                raise ValueError(
                    f"{ITEM}/{group}/{i} does not match its checksum: the data is damaged"
                )


def saved_shapes(folder: Path) -> dict[str, list[tuple[tuple[int, ...], np.dtype]]]:
    """Each group's (shape, dtype) per array, from the checkpoint's own metadata (no array is
    read). ValueError or OSError when the folder is not an Orbax checkpoint."""
    import orbax.checkpoint as ocp

    with _quiet():  # raised inside: a failed read's stragglers are held back too
        meta = ocp.StandardCheckpointer().metadata(_item(folder)).item_metadata
        if meta is None:
            raise ValueError(
                f"{ITEM}/ has no readable metadata: a damaged or partial Orbax checkpoint"
            )
    tree = meta.tree
    if not isinstance(tree, dict) or set(tree) != set(GROUPS):
        raise ValueError(
            f"{ITEM}/ holds {sorted(tree) if isinstance(tree, dict) else tree!r}"
            f", not the groups {', '.join(GROUPS)}"
        )
    return {
        g: [(tuple(int(d) for d in m.shape), np.dtype(m.dtype)) for m in tree[g]] for g in GROUPS
    }


def check_against(saved: dict, wanted: dict[str, list], names: dict[str, list[str]]) -> None:
    """StructureError when a group's count or an array's shape differs from ``wanted``
    (GROUPS -> arrays or ShapeDtypeStructs); ValueError when a dtype does (a file this engine
    did not write: Orbax would cast it silently). Nothing is read or assigned before."""
    for group in GROUPS:
        have, want = saved[group], wanted[group]
        if len(have) != len(want):
            raise StructureError(f"{len(have)} {group} variables saved, this run has {len(want)}")
        for i, ((shape, dtype), w, name) in enumerate(zip(have, want, names[group])):
            if list(shape) != list(w.shape):
                raise StructureError(
                    f"{group} variable {i} has shape {list(shape)}, this "
                    f"run's {name} {list(w.shape)}"
                )
            if dtype != np.dtype(w.dtype):
                raise ValueError(f"{ITEM}/{group}/{i} is {dtype}, not {name}'s {w.dtype}")


def read(folder: Path, targets: dict[str, list]) -> dict[str, list]:
    """The arrays of ``folder/state`` laid out as ``targets`` say (ShapeDtypeStructs with
    shardings): each process reads its own devices' pieces."""
    import orbax.checkpoint as ocp

    with _quiet():
        try:
            values = ocp.StandardCheckpointer().restore(_item(folder), targets)
        except Exception as e:  # TensorStore's message is a repr of its own
            raise ValueError(
                f"{ITEM}/: an array's data cannot be read, damaged or missing ({type(e).__name__})"
            ) from None
    check_sums(folder, values)
    return values


# What Orbax's reader threads print (not raise) when a damaged file ends a read early: asyncio
# tracebacks of a closed event loop, which say nothing the error raised does not.
_NOISE = (
    "Traceback (most recent call last):",
    "asyncio/base_events.py",
    "self._check_closed()",
    "raise RuntimeError('Event loop is closed')",
    "RuntimeError: Event loop is closed",
)


_STRAGGLERS_S = 2.0


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Orbax's reads with that noise, and its warnings (absl's logger), held back: the
    error raised says what is wrong, once."""
    from mirrorfit._frameworks import filtered

    absl = logging.getLogger("absl")
    level = absl.level
    absl.setLevel(logging.ERROR)
    try:
        with filtered(2, lambda line: any(n in line for n in _NOISE)):
            try:
                yield
            except Exception:
                # The reads still in flight when the first failed print as they end: give
                # them time to, inside the filter (a damaged checkpoint's path only).
                time.sleep(_STRAGGLERS_S)
                raise
    finally:
        absl.setLevel(level)


def read_model(folder: Path, model) -> None:
    """The model's variables of a sharded JAX checkpoint, into ``model`` built by any backend
    (``mirrorfit export`` and ``evaluate``): read whole onto the host. The optimizer's are read
    too, for their checksums, and dropped."""
    import jax

    host = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])
    variables = {
        "trainable": list(model.trainable_variables),
        "non_trainable": list(model.non_trainable_variables),
    }
    saved = saved_shapes(folder)
    wanted = {
        g: [
            jax.ShapeDtypeStruct(tuple(map(int, v.shape)), _read_as(v, saved[g], i))
            for i, v in enumerate(vs)
        ]
        for g, vs in variables.items()
    }
    wanted["optimizer"] = [jax.ShapeDtypeStruct(s, d) for s, d in saved["optimizer"]]
    names = {g: [v.path for v in vs] for g, vs in variables.items()}
    names["optimizer"] = [f"optimizer/{i}" for i in range(len(saved["optimizer"]))]
    check_against(saved, wanted, names)
    targets = {
        g: [jax.ShapeDtypeStruct(w.shape, w.dtype, sharding=host) for w in ws]
        for g, ws in wanted.items()
    }
    values = read(folder, targets)
    for group, vs in variables.items():  # checked first, assigned after
        for v, value in zip(vs, values[group]):
            v.assign(np.asarray(value))


def _read_as(variable, saved: list, i: int) -> np.dtype:
    """The dtype to read array ``i`` of a group as: the variable's, but an integer saved as
    another that casts to it safely (a seed generator's state: uint32 on JAX, int64 where
    TensorFlow rebuilds the model), which its assign then casts."""
    want = np.dtype(variable.dtype)
    have = saved[i][1] if i < len(saved) else want
    if want.kind in "iu" and have.kind in "iu" and np.can_cast(have, want, "safe"):
        return have
    return want


__all__ = [
    "ITEM",
    "GROUPS",
    "SUMS",
    "Background",
    "async_checkpointer",
    "write",
    "read",
    "read_model",
    "saved_shapes",
    "check_against",
    "checksums",
    "check_sums",
]
