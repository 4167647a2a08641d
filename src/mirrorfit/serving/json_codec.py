"""TF Serving's REST JSON <-> tensors (util/json_tensor.cc): row (``instances``) and columnar
(``inputs``) requests, ``predictions`` / ``outputs`` responses, tf.Example features for
classify and regress, with TF Serving's error messages."""

from __future__ import annotations

import base64
import binascii
import json
import math
from typing import Any

import grpc
import numpy as np
import tensorflow as tf

from mirrorfit.serving.errors import ServingError, invalid
from mirrorfit.serving.loader import Signature, TensorInfo

_INT_RANGES = {
    tf.int8: (-(2**7), 2**7 - 1),
    tf.int16: (-(2**15), 2**15 - 1),
    tf.int32: (-(2**31), 2**31 - 1),
    tf.uint8: (0, 255),
    tf.int64: (-(2**63), 2**63 - 1),
    tf.uint32: (0, 2**32 - 1),
    tf.uint64: (0, 2**64 - 1),
}
_ROWS_PER_STEP = 64  # ~50,000 numbers of MNIST: a few ms per np.array() call
MAX_DIMS = 64  # numpy's limit on an array's rank: a JSON value nested deeper cannot be a tensor
_TYPE_NAMES = {
    tf.float32: "float",
    tf.float64: "double",
    tf.int8: "int8",
    tf.int16: "int16",
    tf.int32: "int32",
    tf.uint8: "uint8",
    tf.int64: "int64",
    tf.uint32: "uint32",
    tf.uint64: "uint64",
    tf.bool: "bool",
    tf.string: "string",
}


def parse_body(body: bytes, *, yielding: bool = False) -> Any:
    """JSON as TF Serving reads it: NaN/Infinity accepted, trailing bytes ignored, integers as
    rapidjson stores them (see :func:`_parse_int`). ``yielding``: for a thread parsing a large body,
    a Python-level float reader that lets other threads run. (why: docs/architecture.md#serving)
    """
    text = body.decode("utf-8", errors="replace")
    if not text.strip():
        raise invalid("JSON Parse error: The document is empty")
    decoder = json.JSONDecoder(
        parse_int=_parse_int, parse_float=_parse_float if yielding else float
    )
    try:
        value, _ = decoder.raw_decode(text.lstrip())
    except json.JSONDecodeError as e:
        raise invalid(f"JSON Parse error: {e.msg} at offset: {e.pos}") from None
    except RecursionError:
        raise invalid("JSON Parse error: nesting too deep") from None
    return value


def _parse_int(text: str) -> int | float:
    """An integer literal as rapidjson stores it: an int64 or uint64, else a double; beyond a
    double's range it is a parse error. Checking the length first also keeps a literal of
    thousands of digits away from Python's int() (which refuses over 4,300 digits)."""
    if len(text) <= 20:  # the longest int64 / uint64 literal ("-9223372036854775808")
        value = int(text)
        if -(2**63) <= value < 2**64:
            return value
    value = float(text)
    if math.isinf(value):
        shown = text if len(text) <= 40 else f"{text[:20]}... ({len(text)} characters)"
        raise invalid(f"JSON Parse error: Number too big to be stored in double: {shown}")
    return value


def _parse_float(text: str) -> float:
    return float(text)  # a Python frame: a point where the GIL can change hands


def debug_json(value: Any, limit: int = 256) -> str:
    """The first ``limit`` characters of ``value`` as compact JSON, as TF Serving quotes a bad
    value. Written lazily, so a huge or deeply nested value costs no more than a small one."""
    out, size = [], 0
    for token in _tokens(value, limit):
        out.append(token)
        size += len(token)
        if size >= limit:
            break
    return "".join(out)[:limit]


def _tokens(value: Any, limit: int):
    # Each level yields "[" or "{" before going deeper, so the caller stops this generator
    # within ``limit`` levels: the recursion stays shallow whatever the nesting.
    if isinstance(value, list):
        yield "["
        for i, item in enumerate(value):
            if i:
                yield ","
            yield from _tokens(item, limit)
        yield "]"
    elif isinstance(value, dict):
        yield "{"
        for i, (key, item) in enumerate(value.items()):
            yield ("," if i else "") + json.dumps(key[:limit]) + ":"
            yield from _tokens(item, limit)
        yield "}"
    elif isinstance(value, str):
        yield json.dumps(value[:limit])
    else:
        yield json.dumps(value)


def predict_inputs(doc: Any, sig: Signature) -> tuple[dict[str, np.ndarray], bool]:
    """The input arrays of a :predict body, and whether it was the row format."""
    if not isinstance(doc, dict):
        raise invalid(f"JSON Value: {debug_json(doc)} Is not object")
    has_rows, has_cols = "instances" in doc, "inputs" in doc
    if has_rows and has_cols:
        raise invalid(
            f"JSON Value: {debug_json(doc)} Not formatted correctly expecting only one "
            "of 'inputs' or 'instances' keys to exist "
        )
    if not has_rows and not has_cols:
        raise invalid("Missing 'inputs' or 'instances' key")
    if not sig.inputs:
        raise invalid(f"Failed to get input map for signature: {sig.name}")
    if has_rows:
        return _rows(doc["instances"], sig), True
    return _columns(doc["inputs"], sig), False


def _is_b64(value: Any) -> bool:
    return isinstance(value, dict) and len(value) == 1 and isinstance(value.get("b64"), str)


def _rows(instances: Any, sig: Signature) -> dict[str, np.ndarray]:
    if not isinstance(instances, list):
        raise invalid("Expecting 'instances' to be an list/array")
    if not instances:
        raise invalid("No values in 'instances' array")
    named = isinstance(instances[0], dict) and not _is_b64(instances[0])
    if not named:
        if len(sig.inputs) > 1:
            raise invalid(
                "instances is a plain list, but expecting list of objects as multiple "
                "input tensors required as per tensorinfo_map"
            )
        alias, info = next(iter(sig.inputs.items()))
        for i, item in enumerate(instances):
            if isinstance(item, dict) and not _is_b64(item):
                raise invalid(f"Expecting value/list but got object at item {i} of input list")
        return {alias: _tensor(instances, info, batch=True)}
    keys = set(sig.inputs)
    columns: dict[str, list] = {k: [] for k in keys}
    for i, item in enumerate(instances):
        if not isinstance(item, dict) or _is_b64(item):
            raise invalid(f"Expecting object but got list at item {i} of input list")
        for key in item:
            if key not in keys:
                raise invalid(
                    f"Failed to process element: {i} key: {key} of 'instances' list. "
                    f"Error: Invalid argument: JSON object: does not have named "
                    f"input: {key}"
                )
        if set(item) != keys:
            raise invalid(
                f"Failed to process element: {i} of 'instances' list. JSON object: "
                f"{debug_json(item)} keys must be equal to: {','.join(sorted(keys))}"
            )
        for key in keys:
            columns[key].append(item[key])
    return {k: _tensor(v, sig.inputs[k], batch=True) for k, v in columns.items()}


def _columns(inputs: Any, sig: Signature) -> dict[str, np.ndarray]:
    if not isinstance(inputs, dict) or _is_b64(inputs):
        if len(sig.inputs) > 1:
            raise invalid(
                "inputs is a plain value/list, but expecting an object as multiple "
                "input tensors required as per tensorinfo_map"
            )
        alias, info = next(iter(sig.inputs.items()))
        return {alias: _tensor(inputs, info, batch=False)}
    out = {}
    for alias, info in sig.inputs.items():
        if alias not in inputs:
            raise invalid(f"Missing named input: {alias} in 'inputs' object.")
        out[alias] = _tensor(inputs[alias], info, batch=False)
    return out  # extra keys are ignored, as TF Serving does


def _tensor(value: Any, info: TensorInfo, *, batch: bool) -> np.ndarray:
    """A dense array of ``info.dtype`` from nested lists, checked as TF Serving checks."""
    dtype = info.dtype
    if dtype not in _TYPE_NAMES:
        raise ServingError(
            grpc.StatusCode.UNIMPLEMENTED,
            f"Conversion of JSON Value: {debug_json(value)} to type: {dtype.name}",
        )
    if dtype.is_floating and isinstance(value, list):
        # Fast path for the common case, a regular nest of numbers (an image is 784 of them).
        # Anything else (ragged, strings, all-bool) falls through to the checked path.
        # Known leniency: a bool mixed among numbers is read as 0/1 here.
        arr = _dense_numbers(value)
        if arr is not None:
            with np.errstate(over="ignore"):  # past float max is +-inf, as TF Serving
                return arr.astype(dtype.as_numpy_dtype)
    shape = _shape_of(value)
    if len(shape) > MAX_DIMS:
        raise invalid(
            f"JSON Value: {debug_json(value)} is a list nested {len(shape)} deep: "
            f"a tensor has at most {MAX_DIMS} dimensions here"
        )
    flat: list = []
    _fill(value, shape, 0, flat, dtype)
    if batch and len(shape) == 0:
        shape = [len(flat)]
    if dtype == tf.string:
        return np.array(flat, dtype=object).reshape(shape)
    with np.errstate(over="ignore"):
        return np.array(flat, dtype=dtype.as_numpy_dtype).reshape(shape)


def _dense_numbers(value: list) -> np.ndarray | None:
    """``value`` as an array if it is a regular nest of numbers, else None. Converted in slices
    of _ROWS_PER_STEP rows: each np.array() holds the GIL, and a thread converting a large
    request in one call would stop the event loop as long."""
    try:
        parts = [
            np.array(value[i : i + _ROWS_PER_STEP]) for i in range(0, len(value), _ROWS_PER_STEP)
        ]
    except (ValueError, TypeError, RecursionError):  # e.g. ragged, or nested past MAX_DIMS
        return None
    if (
        not parts
        or len({p.shape[1:] for p in parts}) != 1
        or any(p.dtype.kind not in "iuf" for p in parts)
        or not parts[0].size
    ):
        return None
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _shape_of(value: Any) -> list[int]:
    shape = []
    while isinstance(value, list):
        shape.append(len(value))
        if not value:
            break
        value = value[0]
    return shape


def _fill(value: Any, shape: list[int], level: int, out: list, dtype: tf.DType) -> None:
    if isinstance(value, list):
        if level >= len(shape):
            raise invalid(f"Encountered list at unexpected level: {level} expected < {len(shape)}")
        if len(value) != shape[level]:
            raise invalid(
                f"Encountered list at unexpected size: {len(value)} at level: "
                f"{level} expected size: {shape[level]}"
            )
        for item in value:
            _fill(item, shape, level + 1, out, dtype)
        return
    if level != len(shape):
        raise invalid(
            f"JSON Value: {debug_json(value)} found at incorrect level: {level + 1} "
            f"in the JSON DOM. Expected at level: {len(shape) + 1}"
        )
    out.append(_scalar(value, dtype))


def _scalar(value: Any, dtype: tf.DType):
    if dtype == tf.string:
        if isinstance(value, str):
            return _utf8(value)
        if _is_b64(value):
            return _b64decode(value["b64"])
    elif dtype == tf.bool:
        if isinstance(value, bool):
            return value
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        if dtype.is_floating:
            return float(value)
        low, high = _INT_RANGES[dtype]
        if isinstance(value, int) and low <= value <= high:
            return value
    kind = (
        "String"
        if isinstance(value, str)
        else "Object"
        if isinstance(value, dict)
        else "Bool"
        if isinstance(value, bool)
        else "Null"
        if value is None
        else "Number"
    )
    raise invalid(
        f"JSON Value: {debug_json(value)} Type: {kind} is not of expected type: "
        f"{_TYPE_NAMES[dtype]}"
    )


def _utf8(text: str) -> bytes:
    try:
        return text.encode()
    except UnicodeEncodeError:  # a lone surrogate escape such as "\ud800"
        raise invalid(
            f"JSON Value: {debug_json(text)} is not valid UTF-8 (the surrogate pair "
            "in string is invalid)"
        ) from None


def _b64decode(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise invalid(f"Unable to base64 decode: {debug_json(text)}") from None


def predict_response(outputs: dict[str, np.ndarray], row_format: bool) -> dict:
    """``{"predictions": ...}`` (row) or ``{"outputs": ...}`` (columnar), as TF Serving."""
    if not row_format:
        if len(outputs) == 1:
            return {"outputs": _json_value(next(iter(outputs.values())))}
        return {"outputs": {k: _json_value(v) for k, v in outputs.items()}}
    if len(outputs) == 1:
        value = next(iter(outputs.values()))
        return {"predictions": _json_value(value) if value.ndim else [_json_value(value)]}
    sizes = {}
    for alias, value in outputs.items():
        if value.ndim == 0:
            raise invalid(f"Tensor name: {alias} has no shape information ")
        sizes[alias] = value.shape[0]
    batch = next(iter(sizes.values()))
    for alias, n in sizes.items():
        if n != batch:
            raise invalid(
                f"Tensor name: {alias} has inconsistent batch size: {n} expecting: {batch}"
            )
    columns = {k: _json_value(v, alias=k) for k, v in outputs.items()}
    return {"predictions": [{k: columns[k][i] for k in columns} for i in range(batch)]}


def _json_value(value: np.ndarray, alias: str = ""):
    if value.dtype == object or value.dtype.kind in "SU":
        as_b64 = alias.endswith("_bytes")
        flat = [
            {"b64": base64.b64encode(v).decode()}
            if as_b64
            else (v.decode("utf-8", errors="replace") if isinstance(v, bytes) else str(v))
            for v in value.reshape(-1)
        ]
        return np.array(flat, dtype=object).reshape(value.shape).tolist()
    if value.dtype == np.float32:
        # shortest repr that round-trips the float32, as TF Serving prints
        return _nest(
            [
                float(np.format_float_positional(v, unique=True, trim="0"))
                if math.isfinite(v)
                else float(v)
                for v in value.reshape(-1)
            ],
            value.shape,
        )
    if value.dtype.kind in "fiub":
        return value.tolist()
    raise invalid(f"Failed to write JSON value for tensor type: {value.dtype}")


def _nest(flat: list, shape: tuple) -> Any:
    if not shape:
        return flat[0]
    return np.array(flat, dtype=object).reshape(shape).tolist()


def examples(doc: Any, method: str) -> tuple[Any, list]:
    """(context or None, examples) of a :classify / :regress body, still JSON: checked here
    only as a whole, so the signature and the count are checked before any is converted
    (by :func:`example`, within the service's byte bound)."""
    if not isinstance(doc, dict):
        raise invalid(f"JSON Value: {debug_json(doc)} Is not object")
    if "examples" not in doc:
        raise invalid("When method is classify, key 'examples' is expected and was not found")
    items = doc["examples"]
    if not isinstance(items, list):
        raise invalid("Expecting 'examples' value to be an list/array")
    if not items:
        raise invalid("'examples' value is an empty array")
    context = doc.get("context")
    if "context" in doc and not isinstance(context, dict):
        example(context)  # raises its message for a non-object
    return context, items


def example(obj: Any) -> tf.train.Example:
    """A tf.Example from a JSON object of features, as TF Serving converts one."""
    if not isinstance(obj, dict):
        kind = "Array" if isinstance(obj, list) else type(obj).__name__.capitalize()
        raise invalid(f"Example must be JSON object but got JSON {kind}")
    out = tf.train.Example()
    for name, value in obj.items():
        _feature_name(name)
        values = value if isinstance(value, list) else [value]
        kinds = set()
        for v in values:
            if v is None or isinstance(v, (list, dict)) and not _is_b64(v):
                t = "Null" if v is None else "Array" if isinstance(v, list) else "Object"
                raise invalid(f"Feature: {name} has element with unexpected JSON type: {t}")
            kinds.add(
                "bytes"
                if isinstance(v, str) or _is_b64(v)
                else "int64"
                if isinstance(v, (bool, int))
                else "float"
            )
        if len(kinds) > 1:
            first = (
                "bytes"
                if isinstance(values[0], str) or _is_b64(values[0])
                else "int64"
                if isinstance(values[0], (bool, int))
                else "float"
            )
            raise invalid(f"Unexpected element type in feature: {name} expecting type: {first}")
        feature = out.features.feature[name]
        kind = kinds.pop() if kinds else "float"
        if kind == "bytes":
            feature.bytes_list.value.extend(
                _b64decode(v["b64"]) if _is_b64(v) else _utf8(v) for v in values
            )
        elif kind == "int64":
            for v in values:
                if v > 2**63 - 1:
                    raise invalid(
                        f"Feature: {name} has uint64_t element. Only int64_t is supported. Got: {v}"
                    )
            feature.int64_list.value.extend(int(v) for v in values)
        else:
            feature.float_list.value.extend(float(v) for v in values)
    return out


def _feature_name(name: str) -> None:
    try:
        name.encode()
    except UnicodeEncodeError:  # a lone surrogate escape such as "\ud800": not UTF-8
        raise invalid(
            f"Feature name: {debug_json(name)} is not valid UTF-8 (the surrogate pair "
            "in string is invalid)"
        ) from None


__all__ = ["parse_body", "debug_json", "predict_inputs", "predict_response", "examples", "example"]
