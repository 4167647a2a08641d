"""TF Serving's gRPC services (PredictionService, ModelService) with the tensorflow-serving-api
protos, over the same :class:`ModelService` the REST API uses."""

from __future__ import annotations

import logging
import time

import grpc
import numpy as np
from google.protobuf import message_factory
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_service_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2,
    prediction_service_pb2_grpc,
    regression_pb2,
)

from mirrorfit.serving.errors import INTERNAL_MESSAGE, ServingError, invalid, log_internal_error
from mirrorfit.serving.metrics import ServerMetrics
from mirrorfit.serving.service import DEFAULT_SIGNATURE, ModelService, Spec
from mirrorfit.serving.tensor_proto import from_tensor_proto, to_tensor_proto
from mirrorfit.serving.validation import check_names

log = logging.getLogger("mirrorfit.serving")

_STATES = {"START": 10, "LOADING": 20, "AVAILABLE": 30, "UNLOADING": 40, "END": 50}


def _spec(model_spec) -> Spec:
    version = model_spec.version.value if model_spec.HasField("version") else None
    label = model_spec.version_label if model_spec.HasField("version_label") else None
    return Spec(model_spec.name, version, label, model_spec.signature_name)


class _Handler:
    """Common plumbing: run one RPC (an asyncio handler on grpc.aio), map ServingError to its
    status and anything unexpected to INTERNAL (logged as one JSON line), record metrics."""

    def __init__(self, service: ModelService, metrics: ServerMetrics) -> None:
        self.service, self.metrics = service, metrics

    async def _call(self, api: str, request, context, handler):
        start = time.perf_counter()
        model = request.model_spec.name if hasattr(request, "model_spec") else ""
        try:
            if isinstance(request, _Unparsable):
                raise invalid(f"Failed to parse the request as {request.type_name}")
            response, examples = await handler(request)
        except ServingError as e:
            code, message = e.code, e.message
        except Exception as e:  # noqa: BLE001 - a bug or a resource error, never the client's
            # One JSON line for the operator; nothing of Python's text for the client.
            log_internal_error(e, entrypoint="GRPC", model=model, api=api)
            code, message = grpc.StatusCode.INTERNAL, INTERNAL_MESSAGE
        else:
            self._record(model, api, "OK", start, examples)
            return response
        self._record(model, api, code.name, start, 0)
        await context.abort(code, message)

    def _record(self, model, api, status, start, examples):
        elapsed = time.perf_counter() - start
        self.metrics.record(
            model=model,
            api=api,
            entrypoint="GRPC",
            status=status,
            seconds=elapsed,
            examples=examples,
        )
        log.debug(
            "request",
            extra={
                "entrypoint": "GRPC",
                "model": model,
                "api": api,
                "status": status,
                "latency_ms": round(elapsed * 1e3, 3),
            },
        )


class PredictionServicer(_Handler, prediction_service_pb2_grpc.PredictionServiceServicer):
    async def Predict(self, request, context):
        return await self._call("predict", request, context, self._predict)

    async def _predict(self, request):
        spec = _spec(request.model_spec)
        servable, sig = self.service.resolve_signature(spec, entrypoint="GRPC")
        check_names(sig, request.inputs)
        # each checked against the signature and its own declared size before it is decoded
        inputs = {
            k: from_tensor_proto(sig.inputs[k], v, self.service.max_rows)
            for k, v in request.inputs.items()
        }
        outputs = await self.service.predict_async(
            servable, sig, inputs, list(request.output_filter) or None
        )
        response = predict_pb2.PredictResponse()
        _stamp(response, servable, spec.signature_name or DEFAULT_SIGNATURE)
        for alias, value in outputs.items():
            response.outputs[alias].CopyFrom(to_tensor_proto(value))
        return response, next((v.shape[0] for v in inputs.values() if np.ndim(v)), 0)

    async def GetModelMetadata(self, request, context):
        return await self._call("metadata", request, context, self._metadata)

    async def MultiInference(self, request, context):
        return await self._call(
            "multi_inference", request, context, _unimplemented("MultiInference")
        )

    async def _metadata(self, request):
        if not request.metadata_field:
            raise invalid("GetModelMetadataRequest must specify at least one metadata_field")
        for field in request.metadata_field:
            if field != "signature_def":
                raise invalid(f"Metadata field {field} is not supported")
        servable = self.service.metadata(_spec(request.model_spec))
        defs = get_model_metadata_pb2.SignatureDefMap()
        for key, sdef in servable.signature_defs.items():
            defs.signature_def[key].CopyFrom(sdef)
        response = get_model_metadata_pb2.GetModelMetadataResponse()
        response.model_spec.name = servable.name
        response.model_spec.version.value = servable.version
        response.metadata["signature_def"].Pack(defs)
        return response, 0

    async def Classify(self, request, context):
        return await self._call("classify", request, context, self._classify)

    async def _classify(self, request):
        servable, sig = self.service.resolve_signature(_spec(request.model_spec), api="classify")
        examples = _examples(request)
        results = await self.service.classify_async(servable, sig, *examples)
        response = classification_pb2.ClassificationResponse()
        for pairs in results:
            item = response.result.classifications.add()
            for label, score in pairs:
                item.classes.add(label=label, score=score)
        _stamp(response, servable, sig.name)
        return response, len(results)

    async def Regress(self, request, context):
        return await self._call("regress", request, context, self._regress)

    async def _regress(self, request):
        servable, sig = self.service.resolve_signature(_spec(request.model_spec), api="regress")
        values = await self.service.regress_async(servable, sig, *_examples(request))
        response = regression_pb2.RegressionResponse()
        for value in values:
            response.result.regressions.add(value=value)
        _stamp(response, servable, sig.name)
        return response, len(values)


def _examples(request) -> tuple:
    """(context or None, examples) of a Classify/Regress input, as the parsed message holds
    them: no copy, so the service checks their count before any is touched."""
    which = request.input.WhichOneof("kind")
    if which == "example_list":
        return None, request.input.example_list.examples
    if which == "example_list_with_context":
        ctx = request.input.example_list_with_context
        return ctx.context, ctx.examples
    raise invalid("Input is empty")


class ModelServicer(_Handler, model_service_pb2_grpc.ModelServiceServicer):
    async def GetModelStatus(self, request, context):
        return await self._call("status", request, context, self._status)

    async def _status(self, request):
        spec = _spec(request.model_spec)
        response = get_model_status_pb2.GetModelStatusResponse()
        for s in self.service.status(Spec(spec.name, spec.version)):
            item = response.model_version_status.add(version=s.version, state=_STATES[s.state])
            item.status.error_code = _error_code(s.error_code)
            item.status.error_message = s.error_message
        return response, 0

    async def HandleReloadConfigRequest(self, request, context):
        return await self._call(
            "reload_config", request, context, _unimplemented("HandleReloadConfigRequest")
        )


def _stamp(response, servable, signature_name: str) -> None:
    """The model spec TF Serving puts in every response: name, version, signature."""
    response.model_spec.name = servable.name
    response.model_spec.version.value = servable.version
    response.model_spec.signature_name = signature_name


def _error_code(name: str) -> int:
    return grpc.StatusCode[name].value[0] if name in grpc.StatusCode.__members__ else 2


def _unimplemented(method: str):
    async def handler(request):
        raise ServingError(
            grpc.StatusCode.UNIMPLEMENTED, f"{method} is not implemented by this server"
        )

    return handler


class _Unparsable:
    """A request body that is not the method's message: the client's error, answered with
    INVALID_ARGUMENT (grpc's own deserializer failure is UNKNOWN with Python's text)."""

    def __init__(self, type_name: str) -> None:
        self.type_name = type_name


def _parser(message_class):
    def parse(raw: bytes):
        try:
            return message_class.FromString(raw)
        except Exception:  # noqa: BLE001 - DecodeError, nesting too deep: any bad bytes
            return _Unparsable(message_class.DESCRIPTOR.full_name)

    return parse


def _register(server: grpc.Server, descriptor, servicer) -> None:
    """Every method of ``descriptor`` on ``servicer``, with :func:`_parser` requests."""
    handlers = {}
    for method in descriptor.methods:
        handlers[method.name] = grpc.unary_unary_rpc_method_handler(
            getattr(servicer, method.name),
            request_deserializer=_parser(message_factory.GetMessageClass(method.input_type)),
            response_serializer=message_factory.GetMessageClass(
                method.output_type
            ).SerializeToString,
        )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(descriptor.full_name, handlers),)
    )


def add_services(server: grpc.Server, service: ModelService, metrics: ServerMetrics) -> None:
    _register(
        server,
        prediction_service_pb2.DESCRIPTOR.services_by_name["PredictionService"],
        PredictionServicer(service, metrics),
    )
    _register(
        server,
        model_service_pb2.DESCRIPTOR.services_by_name["ModelService"],
        ModelServicer(service, metrics),
    )


__all__ = ["add_services", "to_tensor_proto"]
