"""TensorProto <-> numpy for the gRPC API. Outputs are written in the typed ``*_val`` fields, as
TF Serving does by default; inputs are checked against the signature and their own declared
size before they are decoded (at most 8 bytes decoded per byte received).
(why: docs/architecture.md#serving)
"""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2, types_pb2

from mirrorfit.serving.errors import invalid
from mirrorfit.serving.loader import TensorInfo
from mirrorfit.serving.validation import check_declared, dtype_name

_T = types_pb2
# dtype -> the typed field holding its values, and how many field entries make one value
_FIELDS = {
    _T.DT_FLOAT: ("float_val", 1),
    _T.DT_DOUBLE: ("double_val", 1),
    _T.DT_INT32: ("int_val", 1),
    _T.DT_INT16: ("int_val", 1),
    _T.DT_INT8: ("int_val", 1),
    _T.DT_UINT8: ("int_val", 1),
    _T.DT_UINT16: ("int_val", 1),
    _T.DT_INT64: ("int64_val", 1),
    _T.DT_UINT32: ("uint32_val", 1),
    _T.DT_UINT64: ("uint64_val", 1),
    _T.DT_BOOL: ("bool_val", 1),
    _T.DT_STRING: ("string_val", 1),
    _T.DT_HALF: ("half_val", 1),
    _T.DT_BFLOAT16: ("half_val", 1),
    _T.DT_COMPLEX64: ("scomplex_val", 2),
    _T.DT_COMPLEX128: ("dcomplex_val", 2),
}
_OUT_FIELDS = {
    _T.DT_FLOAT: "float_val",
    _T.DT_DOUBLE: "double_val",
    _T.DT_INT32: "int_val",
    _T.DT_INT16: "int_val",
    _T.DT_INT8: "int_val",
    _T.DT_UINT8: "int_val",
    _T.DT_INT64: "int64_val",
    _T.DT_BOOL: "bool_val",
    _T.DT_STRING: "string_val",
    _T.DT_UINT32: "uint32_val",
    _T.DT_UINT64: "uint64_val",
}


def to_tensor_proto(value: np.ndarray) -> tensor_pb2.TensorProto:
    """An output as TF Serving writes it by default: the typed ``*_val`` field."""
    dtype = tf.as_dtype(value.dtype if value.dtype != object else tf.string).as_datatype_enum
    proto = tensor_pb2.TensorProto(
        dtype=dtype,
        tensor_shape=tensor_shape_pb2.TensorShapeProto(
            dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=n) for n in value.shape]
        ),
    )
    getattr(proto, _OUT_FIELDS.get(dtype, "float_val")).extend(value.reshape(-1).tolist())
    return proto


def from_tensor_proto(info: TensorInfo, proto: tensor_pb2.TensorProto, max_rows: int) -> np.ndarray:
    """The input ``info`` describes, decoded from ``proto`` once its dtype, shape, rows and
    size are checked."""
    alias = info.alias
    if proto.tensor_shape.unknown_rank:
        raise invalid(f"tensor parsing error: {alias} (its tensor_shape has unknown rank)")
    dims = tuple(d.size for d in proto.tensor_shape.dim)
    check_declared(info, proto.dtype, dims, max_rows)
    count = math.prod(dims)
    if proto.dtype not in _FIELDS:
        raise invalid(
            f"tensor parsing error: {alias} (dtype {dtype_name(proto.dtype)} is not supported)"
        )
    field, per_value = _FIELDS[proto.dtype]
    if proto.tensor_content:
        if proto.dtype == _T.DT_STRING:
            raise invalid(f"tensor parsing error: {alias} (send strings in string_val)")
        have, want = len(proto.tensor_content), count * tf.as_dtype(proto.dtype).size
        unit = "bytes of tensor_content"
    else:
        have, want = len(getattr(proto, field)), count * per_value
        unit = f"entries in {field}"
    if have != want:
        raise invalid(
            f"tensor parsing error: {alias} (tensor_shape {list(dims)} needs {want} "
            f"{unit}; the request has {have})"
        )
    try:
        return tf.make_ndarray(proto)
    except (TypeError, ValueError, OverflowError):  # e.g. 300 in int_val for a uint8 input
        raise invalid(
            f"tensor parsing error: {alias} (values out of range for {dtype_name(proto.dtype)})"
        ) from None


__all__ = ["from_tensor_proto", "to_tensor_proto"]
