"""Load one SavedModel version: its signatures (callable, with dtypes and shapes), the
SignatureDefs as stored (for metadata), and a warm-up before it takes traffic."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import meta_graph_pb2, saved_model_pb2

from mirrorfit.serving.errors import ServingError, invalid

DEFAULT_SIGNATURE = "serving_default"
WARMUP_FILE = Path("assets.extra") / "tf_serving_warmup_requests"


@dataclass(frozen=True)
class TensorInfo:
    """One signature input or output: its alias, dtype and shape (None for unknown dims)."""

    alias: str
    dtype: tf.DType
    shape: tuple[int | None, ...] | None  # None: unknown rank


@dataclass(frozen=True)
class Signature:
    """A callable signature: ``run({alias: ndarray}) -> {alias: ndarray}``."""

    name: str
    inputs: dict[str, TensorInfo]
    outputs: dict[str, TensorInfo]
    method_name: str
    _fn: Callable

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        tensors = {}
        for alias, info in self.inputs.items():
            value = inputs[alias]
            try:
                tensors[alias] = tf.convert_to_tensor(value, dtype=info.dtype)
            except (TypeError, ValueError):  # (callers check dtypes first; Python's text
                raise invalid(
                    f"input {alias}: cannot convert to {info.dtype.name}"
                ) from None  # is no message for a client)
            _check_shape(alias, tensors[alias].shape, info.shape)
        try:
            out = self._fn(**tensors)
        except tf.errors.InvalidArgumentError as e:
            raise invalid(op_error_text(e.message)) from None
        except tf.errors.OpError as e:
            raise ServingError(_grpc_code(e), op_error_text(e.message)) from None
        return {alias: out[alias].numpy() for alias in self.outputs}

    @property
    def batched(self) -> bool:
        """Whether every input and output has a leading (batch) dimension."""
        infos = list(self.inputs.values()) + list(self.outputs.values())
        return all(i.shape is not None and len(i.shape) >= 1 for i in infos)


def op_error_text(message: str) -> str:
    """TensorFlow's own words for a failed op ("indices[0] = 5 is not in [0, 2)"), without
    the "Graph execution error:" header, the Python stack (the server's file paths are no
    business of a client) and the graph node it appends."""
    kept = [
        line.strip()
        for line in message.splitlines()
        if line.strip()
        and not line.startswith(("Graph execution error", "Detected at node", " ", "\t"))
    ]
    return kept[-1] if kept else "the model failed on this input"


@dataclass(frozen=True)
class LoadedVersion:
    """A servable: one version of one model, loaded and warmed up."""

    name: str
    version: int
    path: str
    signatures: dict[str, Signature]
    signature_defs: dict[str, meta_graph_pb2.SignatureDef]  # as stored, incl. the init op
    _keepalive: object = None  # the loaded object owns the variables the functions use
    class_names: tuple[str, ...] | None = None  # mirrorfit's export asset, if it has one


def load_version(
    name: str, version: int, path: str, *, tags: str = "serve", warmup: bool = True
) -> LoadedVersion:
    """Load ``path`` (a SavedModel folder) as ``name`` version ``version`` and warm it up.

    Raises any error TensorFlow raises for a broken SavedModel; the repository records it.
    """
    loaded = tf.saved_model.load(path, tags=[t for t in tags.split(",") if t])
    defs = _signature_defs(Path(path), tags)
    signatures = {}
    for sig_name, fn in loaded.signatures.items():
        sdef = defs.get(sig_name)
        inputs = {
            a: TensorInfo(a, s.dtype, _shape(s.shape))
            for a, s in fn.structured_input_signature[1].items()
        }
        outputs = {
            a: TensorInfo(a, s.dtype, _shape(s.shape)) for a, s in fn.structured_outputs.items()
        }
        signatures[sig_name] = Signature(
            sig_name, inputs, outputs, sdef.method_name if sdef else "", fn
        )
    version_ = LoadedVersion(
        name, version, path, signatures, defs, loaded, class_names=_class_names(Path(path))
    )
    if warmup:
        _warm_up(version_)
    return version_


def _class_names(path: Path) -> tuple[str, ...] | None:
    """The class names ``mirrorfit train``/``export`` wrote as an asset (label i on line i),
    for /metadata; None without one. At most 1 MiB of them is read."""
    try:
        with open(path / "assets" / "class_names.txt", "rb") as f:
            raw = f.read(1 << 20)
    except OSError:
        return None
    return tuple(raw.decode("utf-8", "replace").splitlines())


def _signature_defs(path: Path, tags: str) -> dict[str, meta_graph_pb2.SignatureDef]:
    proto = saved_model_pb2.SavedModel.FromString((path / "saved_model.pb").read_bytes())
    wanted = set(t for t in tags.split(",") if t)
    for graph in proto.meta_graphs:
        if set(graph.meta_info_def.tags) == wanted:
            return dict(graph.signature_def)
    return dict(proto.meta_graphs[0].signature_def) if proto.meta_graphs else {}


def _warm_up(version: LoadedVersion) -> None:
    """Replay ``assets.extra/tf_serving_warmup_requests`` if present, else call each batched
    signature on one zero example, so the first real request does not pay for tracing."""
    warmup_file = Path(version.path) / WARMUP_FILE
    if warmup_file.is_file():
        from tensorflow_serving.apis import prediction_log_pb2

        for record in tf.data.TFRecordDataset(str(warmup_file)):
            log = prediction_log_pb2.PredictionLog.FromString(record.numpy())
            if log.WhichOneof("log_type") == "predict_log":
                req = log.predict_log.request
                sig = version.signatures.get(req.model_spec.signature_name or DEFAULT_SIGNATURE)
                if sig is not None:
                    sig.run({k: tf.make_ndarray(v) for k, v in req.inputs.items()})
        return
    for sig in version.signatures.values():
        if sig.batched and all(
            i.dtype != tf.string and None not in i.shape[1:] for i in sig.inputs.values()
        ):
            sig.run(
                {
                    a: np.zeros((1, *i.shape[1:]), i.dtype.as_numpy_dtype)
                    for a, i in sig.inputs.items()
                }
            )


def _shape(shape: tf.TensorShape) -> tuple[int | None, ...] | None:
    return None if shape.rank is None else tuple(shape.as_list())


def _check_shape(alias: str, got: tf.TensorShape, want: tuple | None) -> None:
    if want is None:
        return
    if got.rank != len(want) or any(w is not None and g != w for g, w in zip(got, want)):
        shown = ",".join("-1" if w is None else str(w) for w in want)
        raise invalid(
            f"input {alias}: shape {got.as_list()} does not match the signature's [{shown}]"
        )


def _grpc_code(error: tf.errors.OpError):
    import grpc

    return {c.value[0]: c for c in grpc.StatusCode}.get(error.error_code, grpc.StatusCode.INTERNAL)


__all__ = ["LoadedVersion", "Signature", "TensorInfo", "load_version", "DEFAULT_SIGNATURE"]
