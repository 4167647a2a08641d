"""serving.grpc_service: PredictionService and ModelService through the real
tensorflow-serving-api stubs, against a real `mirrorfit serve` process."""

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
    regression_pb2,
)

from serving_support import model_root, server  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stubs(server):
    channel = grpc.insecure_channel(server.grpc_target)
    yield (
        prediction_service_pb2_grpc.PredictionServiceStub(channel),
        model_service_pb2_grpc.ModelServiceStub(channel),
    )
    channel.close()


def _predict_request(name, images, version=None, label=None, signature=""):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = name
    request.model_spec.signature_name = signature
    if version is not None:
        request.model_spec.version.value = version
    if label is not None:
        request.model_spec.version_label = label
    request.inputs["images"].CopyFrom(tf.make_tensor_proto(images))
    return request


def test_predict_returns_typed_outputs_and_the_resolved_spec(stubs):
    predict, _ = stubs
    images = np.random.default_rng(0).uniform(0, 1, (4, 28, 28)).astype(np.float32)
    response = predict.Predict(_predict_request("mnist", images), timeout=30)
    out = response.outputs["probabilities"]
    assert out.float_val and not out.tensor_content  # TF Serving's default: typed fields
    probs = tf.make_ndarray(out)
    assert probs.shape == (4, 10) and np.allclose(probs.sum(1), 1, atol=1e-5)
    assert response.model_spec.name == "mnist" and response.model_spec.version.value == 2
    assert response.model_spec.signature_name == "serving_default"
    v1 = predict.Predict(_predict_request("mnist", images, version=1), timeout=30)
    stable = predict.Predict(_predict_request("mnist", images, label="stable"), timeout=30)
    assert v1.model_spec.version.value == stable.model_spec.version.value == 1
    assert not np.allclose(tf.make_ndarray(v1.outputs["probabilities"]), probs)


def test_rest_and_grpc_agree(stubs, server):
    import httpx

    predict, _ = stubs
    image = np.linspace(0, 1, 784, dtype=np.float32).reshape(1, 28, 28)
    grpc_out = tf.make_ndarray(
        predict.Predict(_predict_request("mnist", image), timeout=30).outputs["probabilities"]
    )
    rest_out = httpx.post(
        f"{server.url}/v1/models/mnist:predict", json={"instances": image.tolist()}, timeout=30
    ).json()["predictions"]
    np.testing.assert_allclose(grpc_out, rest_out, rtol=1e-6)


def test_output_filter_and_multiple_inputs(stubs):
    predict, _ = stubs
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "multi"
    request.model_spec.signature_name = "multi"
    request.inputs["a"].CopyFrom(tf.make_tensor_proto(np.array([[1, 2]], np.float32)))
    request.inputs["b"].CopyFrom(tf.make_tensor_proto(np.array([[3, 4]], np.float32)))
    request.output_filter.append("product")
    response = predict.Predict(request, timeout=30)
    assert list(response.outputs) == ["product"]
    assert tf.make_ndarray(response.outputs["product"]).tolist() == [[3.0, 8.0]]


def test_metadata_packs_the_signature_def_map(stubs):
    predict, _ = stubs
    request = get_model_metadata_pb2.GetModelMetadataRequest()
    request.model_spec.name = "multi"
    request.metadata_field.append("signature_def")
    response = predict.GetModelMetadata(request, timeout=30)
    defs = get_model_metadata_pb2.SignatureDefMap()
    response.metadata["signature_def"].Unpack(defs)
    assert {"multi", "ints", "classify_x", "regress_x", "serving_default"} <= set(
        defs.signature_def
    )
    assert set(defs.signature_def["multi"].inputs) == {"a", "b"}
    assert response.model_spec.version.value == 7


def _examples(request, rows, context=None):
    if context is None:
        target = request.input.example_list.examples
    else:
        request.input.example_list_with_context.context.CopyFrom(context)
        target = request.input.example_list_with_context.examples
    for row in rows:
        example = tf.train.Example()
        if row is not None:
            example.features.feature["x"].float_list.value.extend(row)
        target.append(example)


def test_classify_and_regress(stubs):
    predict, _ = stubs
    request = classification_pb2.ClassificationRequest()
    request.model_spec.name = "multi"
    request.model_spec.signature_name = "classify_x"
    _examples(request, [[1.0, 0.0], [0.0, 2.5]])
    response = predict.Classify(request, timeout=30)
    classes = response.result.classifications
    assert [c.label for c in classes[0].classes] == ["left", "right", "both"]
    assert sum(c.score for c in classes[1].classes) == pytest.approx(1.0, abs=1e-6)
    request = regression_pb2.RegressionRequest()
    request.model_spec.name = "multi"
    request.model_spec.signature_name = "regress_x"
    context = tf.train.Example()
    context.features.feature["x"].float_list.value.extend([1.0, 1.0])
    _examples(request, [[1.0, 0.5], None], context=context)
    values = [r.value for r in predict.Regress(request, timeout=30).result.regressions]
    assert values == pytest.approx([2.0, 3.0])


def test_model_status(stubs):
    _, models = stubs
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = "mnist"
    response = models.GetModelStatus(request, timeout=30)
    assert [(s.version, s.state, s.status.error_code) for s in response.model_version_status] == [
        (2, 30, 0),
        (1, 30, 0),
    ]  # AVAILABLE, OK


@pytest.mark.parametrize(
    "make, code, message",
    [
        (
            lambda: _predict_request("half", np.zeros((1, 28, 28), np.float32)),
            grpc.StatusCode.NOT_FOUND,
            "Servable not found for request: Latest(half)",
        ),
        (
            lambda: _predict_request("mnist", np.zeros((1, 28, 28), np.float32), version=9),
            grpc.StatusCode.NOT_FOUND,
            "Servable not found for request: Specific(mnist, 9)",
        ),
        (
            lambda: _predict_request("mnist", np.zeros((1, 28, 28), np.float32), signature="nope"),
            grpc.StatusCode.FAILED_PRECONDITION,
            'Serving signature key "nope" not found.',
        ),
        (
            lambda: _predict_request("mnist", np.zeros((1, 28, 28), np.float32), label="beta"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "Unrecognized servable version label: beta",
        ),
        (
            lambda: _predict_request("mnist", np.zeros((1, 5), np.float32)),
            grpc.StatusCode.INVALID_ARGUMENT,
            "shape",
        ),
    ],
)
def test_predict_errors(stubs, make, code, message):
    predict, _ = stubs
    with pytest.raises(grpc.RpcError) as info:
        predict.Predict(make(), timeout=30)
    assert info.value.code() == code and message in info.value.details()


def test_missing_input_and_bad_filter(stubs):
    predict, _ = stubs
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "multi"
    request.model_spec.signature_name = "multi"
    request.inputs["a"].CopyFrom(tf.make_tensor_proto(np.zeros((1, 2), np.float32)))
    with pytest.raises(grpc.RpcError) as info:
        predict.Predict(request, timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "input size does not match signature: 1!=2" in info.value.details()
    assert "Missing but required: {b}" in info.value.details()
    request.inputs["b"].CopyFrom(tf.make_tensor_proto(np.zeros((1, 2), np.float32)))
    request.output_filter.append("ratio")
    with pytest.raises(grpc.RpcError) as info:
        predict.Predict(request, timeout=30)
    assert "output tensor alias not found in signature: ratio" in info.value.details()


def test_metadata_field_is_required(stubs):
    predict, _ = stubs
    request = get_model_metadata_pb2.GetModelMetadataRequest()
    request.model_spec.name = "mnist"
    with pytest.raises(grpc.RpcError) as info:
        predict.GetModelMetadata(request, timeout=30)
    assert "must specify at least one metadata_field" in info.value.details()


def _raw_request(name, signature, alias, proto):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = name
    request.model_spec.signature_name = signature
    request.inputs[alias].CopyFrom(proto)
    return request


def _declared(dtype, dims, **values):
    proto = tf.make_tensor_proto(np.zeros(0, np.float32))  # then overwritten
    proto.Clear()
    proto.dtype = dtype
    for n in dims:
        proto.tensor_shape.dim.add(size=n)
    for field, vals in values.items():
        if field == "tensor_content":
            proto.tensor_content = vals
        else:
            getattr(proto, field).extend(vals)
    return proto


@pytest.mark.parametrize(
    "request_, message",
    [
        # issue 10 item 6: DT_FLOAT for an int32 input was silently cast
        (
            lambda: _raw_request(
                "multi", "ints", "ids", tf.make_tensor_proto(np.ones((1, 3), np.float32))
            ),
            "Expected input ids to be int32 but get float.",
        ),
        # item 2: 18 bytes declaring a 3 GB tensor became a zero array
        (
            lambda: _raw_request("mnist", "", "images", _declared(1, [1000000, 28, 28])),
            "input images: 1000000 rows is more than the limit of 1000 rows per request",
        ),
        (
            lambda: _raw_request("mnist", "", "images", _declared(1, [2, 28, 28], float_val=[0.5])),
            "tensor parsing error: images (tensor_shape [2, 28, 28] needs 1568 entries in "
            "float_val; the request has 1)",
        ),
        (
            lambda: _raw_request(
                "mnist", "", "images", _declared(1, [1, 28, 28], tensor_content=b"\0" * 12)
            ),
            "tensor parsing error: images (tensor_shape [1, 28, 28] needs 3136 bytes of "
            "tensor_content; the request has 12)",
        ),
        (
            lambda: _raw_request("mnist", "", "images", _declared(1, [1, -1, 28])),
            "dimensions must be >= 0",
        ),
    ],
)
def test_bad_tensor_protos_are_invalid_argument(stubs, request_, message):
    predict, _ = stubs
    with pytest.raises(grpc.RpcError) as info:
        predict.Predict(request_(), timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in info.value.details()


def test_max_request_bytes_applies_to_grpc(stubs):
    # the module's server runs with --max_request_bytes=1000000; gRPC's own limit was 2 GiB
    predict, _ = stubs
    images = np.zeros((400, 28, 28), np.float32)  # 1.25 MB
    with pytest.raises(grpc.RpcError) as info:
        predict.Predict(_predict_request("mnist", images), timeout=30)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_an_unexpected_error_is_internal_with_one_log_line_and_no_python_text(caplog):
    # item 5: any exception used to reach the client as UNKNOWN with Python's text
    import asyncio

    from mirrorfit.serving.grpc_service import PredictionServicer

    class Context:
        async def abort(self, code, message):
            self.code, self.message = code, message
            raise grpc.aio.AbortError()

    async def broken(request):
        raise MemoryError("Unable to allocate 3.06 PiB for an array")

    class Metrics:
        def record(self, **kw):
            self.status = kw["status"]

    servicer, context = PredictionServicer(None, Metrics()), Context()
    with pytest.raises(grpc.aio.AbortError):
        asyncio.run(servicer._call("predict", predict_pb2.PredictRequest(), context, broken))
    assert context.code == grpc.StatusCode.INTERNAL and "PiB" not in context.message
    assert servicer.metrics.status == "INTERNAL"
    [record] = [r for r in caplog.records if r.name == "mirrorfit.serving"]
    assert record.levelname == "ERROR" and record.exc_info is None
    assert "Unable to allocate" in record.error and record.where.endswith(" in broken")


def test_values_out_of_range_for_a_small_int_dtype_are_invalid_argument():
    from mirrorfit.serving.errors import ServingError
    from mirrorfit.serving.loader import TensorInfo
    from mirrorfit.serving.tensor_proto import from_tensor_proto

    info = TensorInfo("pixels", tf.uint8, (None, 2))
    ok = from_tensor_proto(info, _declared(4, [1, 2], int_val=[0, 255]), max_rows=10)
    assert ok.dtype == np.uint8 and ok.tolist() == [[0, 255]]
    with pytest.raises(
        ServingError,
        match=r"tensor parsing error: pixels \(values out of "
        r"range for uint8\)",
    ):
        from_tensor_proto(info, _declared(4, [1, 2], int_val=[0, 300]), max_rows=10)


@pytest.mark.parametrize(
    "method, body, code, message",
    [
        (
            "PredictionService/Predict",
            b"\xff\xff\xff garbage",
            grpc.StatusCode.INVALID_ARGUMENT,
            "Failed to parse the request as tensorflow.serving.PredictRequest",
        ),
        (
            "PredictionService/MultiInference",
            b"",
            grpc.StatusCode.UNIMPLEMENTED,
            "MultiInference is not implemented by this server",
        ),
        (
            "ModelService/HandleReloadConfigRequest",
            b"",
            grpc.StatusCode.UNIMPLEMENTED,
            "HandleReloadConfigRequest is not implemented",
        ),
    ],
)
def test_garbage_and_unimplemented_methods_get_a_status_without_python_text(
    server, method, body, code, message
):
    # grpc's own answers were UNKNOWN "Unexpected <class '...DecodeError'>: ..." and
    # UNIMPLEMENTED "Unexpected <class 'NotImplementedError'>: ..."
    with grpc.insecure_channel(server.grpc_target) as channel:
        call = channel.unary_unary(f"/tensorflow.serving.{method}")
        with pytest.raises(grpc.RpcError) as info:
            call(body, timeout=30)
    assert info.value.code() == code and message in info.value.details()
    assert "class" not in info.value.details()
