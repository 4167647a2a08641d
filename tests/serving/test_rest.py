"""serving.rest: TF Serving's REST API, case by case from its specification
(../shared/docs/tf-serving-api.md), against a real `mirrorfit serve` process."""

import base64
import gzip
import json

import httpx
import numpy as np
import pytest

from serving_support import model_root, server  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow

IMAGE = np.linspace(0, 1, 28 * 28, dtype=np.float32).reshape(28, 28)


def _post(server, path, body, **kw):
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return httpx.post(server.url + path, content=data, timeout=30, **kw)


def test_model_status_lists_every_version(server):
    r = httpx.get(f"{server.url}/v1/models/mnist")
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    body = r.json()
    assert body == {
        "model_version_status": [
            {
                "version": "2",
                "state": "AVAILABLE",
                "status": {"error_code": "OK", "error_message": ""},
            },
            {
                "version": "1",
                "state": "AVAILABLE",
                "status": {"error_code": "OK", "error_message": ""},
            },
        ]
    }
    one = httpx.get(f"{server.url}/v1/models/mnist/versions/1").json()
    assert [s["version"] for s in one["model_version_status"]] == ["1"]
    # TF Serving's status endpoint does not resolve labels: every version
    labelled = httpx.get(f"{server.url}/v1/models/mnist/labels/stable").json()
    assert len(labelled["model_version_status"]) == 2


def test_metadata_has_the_signature_defs_as_stored(server):
    r = httpx.get(f"{server.url}/v1/models/mnist/metadata")
    assert r.status_code == 200
    body = r.json()
    assert body["model_spec"] == {"name": "mnist", "signature_name": "", "version": "2"}
    sigs = body["metadata"]["signature_def"]["signature_def"]  # nested twice, as TF Serving
    default = sigs["serving_default"]
    assert default["method_name"] == "tensorflow/serving/predict"
    images = default["inputs"]["images"]
    assert images["dtype"] == "DT_FLOAT"
    assert [d["size"] for d in images["tensor_shape"]["dim"]] == ["-1", "28", "28"]
    assert default["outputs"]["probabilities"]["dtype"] == "DT_FLOAT"
    assert "__saved_model_init_op" in sigs
    v1 = httpx.get(f"{server.url}/v1/models/mnist/versions/1/metadata").json()
    assert v1["model_spec"]["version"] == "1"


def test_predict_row_format(server):
    r = _post(server, "/v1/models/mnist:predict", {"instances": [IMAGE.tolist()] * 3})
    assert r.status_code == 200, r.text
    predictions = r.json()["predictions"]
    assert np.array(predictions).shape == (3, 10)
    assert np.allclose(np.sum(predictions, axis=1), 1, atol=1e-5)


def test_predict_columnar_format_and_versions_and_labels(server):
    body = {"inputs": [IMAGE.tolist()]}
    latest = _post(server, "/v1/models/mnist:predict", body).json()["outputs"]
    v2 = _post(server, "/v1/models/mnist/versions/2:predict", body).json()["outputs"]
    v1 = _post(server, "/v1/models/mnist/versions/1:predict", body).json()["outputs"]
    canary = _post(server, "/v1/models/mnist/labels/canary:predict", body).json()["outputs"]
    stable = _post(server, "/v1/models/mnist/labels/stable:predict", body).json()["outputs"]
    assert np.array(latest).shape == (1, 10)
    assert latest == v2 == canary and v1 == stable and v1 != v2


def test_predict_multiple_inputs_and_outputs(server):
    rows = {
        "signature_name": "multi",
        "instances": [{"a": [1, 2], "b": [3, 4]}, {"a": [0.5, 0], "b": [1, 1]}],
    }
    r = _post(server, "/v1/models/multi:predict", rows)
    assert r.status_code == 200, r.text
    assert sorted(r.json()["predictions"], key=str) == sorted(
        [{"sum": [4.0, 6.0], "product": [3.0, 8.0]}, {"sum": [1.5, 1.0], "product": [0.5, 0.0]}],
        key=str,
    )
    cols = {"signature_name": "multi", "inputs": {"a": [[1, 2]], "b": [[3, 4]], "extra": 1}}
    out = _post(server, "/v1/models/multi:predict", cols).json()["outputs"]
    assert out == {"sum": [[4.0, 6.0]], "product": [[3.0, 8.0]]}  # extra keys are ignored


def test_predict_integer_inputs(server):
    r = _post(
        server, "/v1/models/multi:predict", {"signature_name": "ints", "instances": [[1, 2, 3]]}
    )
    assert r.json() == {"predictions": [[2, 4, 6]]}


def test_classify_and_regress(server):
    body = {"signature_name": "classify_x", "examples": [{"x": [1.0, 0.0]}, {"x": [0.0, 2.5]}]}
    r = _post(server, "/v1/models/multi:classify", body)
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [label for label, _ in results[0]] == ["left", "right", "both"]
    assert sum(score for _, score in results[1]) == pytest.approx(1.0, abs=1e-6)
    reg = _post(
        server,
        "/v1/models/multi:regress",
        {
            "signature_name": "regress_x",
            "context": {"x": [1.0, 1.0]},
            "examples": [{"x": [1.0, 0.5]}, {}],
        },
    )
    assert reg.status_code == 200, reg.text
    assert reg.json() == {"results": [2.0, 3.0]}  # 1*1 + 2*0.5; the context's 1*1 + 2*1


ERRORS = [
    # (method, path, body, status, message) as TF Serving answers them
    (
        "POST",
        "/v1/models/half:predict",
        {"instances": [1]},
        404,
        "Servable not found for request: Latest(half)",
    ),
    (
        "POST",
        "/v1/models/mnist/versions/50:predict",
        {"instances": [1]},
        404,
        "Servable not found for request: Specific(mnist, 50)",
    ),
    ("GET", "/v1/models/foo", None, 404, "Could not find any versions of model foo"),
    ("GET", "/v1/models/mnist/versions/50", None, 404, "Could not find version 50 of model mnist"),
    (
        "POST",
        "/v1/models/mnist/labels/beta:predict",
        {"instances": [1]},
        400,
        "Unrecognized servable version label: beta",
    ),
    (
        "POST",
        "/v1/models/mnist:predict",
        {"signature_name": "nope", "instances": [1]},
        400,
        'Serving signature name: "nope" not found in signature def',
    ),
    (
        "POST",
        "/v1/models/multi:classify",
        {"signature_name": "nope", "examples": [{}]},
        400,
        "No signature was found with the name: nope",
    ),
    ("GET", "/v1/models", None, 400, "Missing model name in request."),
    (
        "GET",
        "/v1/models/mnist/versions/HELLO",
        None,
        400,
        "Malformed request: GET /v1/models/mnist/versions/HELLO",
    ),
    (
        "POST",
        "/v1/models/mnist/metadata",
        {},
        400,
        "Malformed request: POST /v1/models/mnist/metadata",
    ),
    (
        "GET",
        "/v1/models/mnist:predict",
        None,
        400,
        "Malformed request: GET /v1/models/mnist:predict",
    ),
    (
        "GET",
        "/v1/models/mnist/versions/99999999999999999999",
        None,
        400,
        "Failed to convert version: 99999999999999999999 to numeric.",
    ),
    ("POST", "/v1/models/mnist:predict", b"", 400, "JSON Parse error: The document is empty"),
    ("POST", "/v1/models/mnist:predict", b"{nope", 400, "JSON Parse error:"),
    ("POST", "/v1/models/mnist:predict", [1, 2], 400, "Is not object"),
    (
        "POST",
        "/v1/models/mnist:predict",
        {"signature_name": 3, "instances": [1]},
        400,
        "'signature_name' key must be a string value.",
    ),
    (
        "POST",
        "/v1/models/mnist:predict",
        {"instances": [1], "inputs": [1]},
        400,
        "expecting only one of 'inputs' or 'instances' keys to exist",
    ),
    ("POST", "/v1/models/mnist:predict", {}, 400, "Missing 'inputs' or 'instances' key"),
    (
        "POST",
        "/v1/models/mnist:predict",
        {"instances": 3},
        400,
        "Expecting 'instances' to be an list/array",
    ),
    ("POST", "/v1/models/mnist:predict", {"instances": []}, 400, "No values in 'instances' array"),
    (
        "POST",
        "/v1/models/multi:predict",
        {"signature_name": "multi", "instances": [[1, 2]]},
        400,
        "instances is a plain list, but expecting list of objects as multiple input tensors",
    ),
    (
        "POST",
        "/v1/models/multi:predict",
        {"signature_name": "multi", "instances": [{"a": [1, 2]}]},
        400,
        "keys must be equal to: a,b",
    ),
    (
        "POST",
        "/v1/models/multi:predict",
        {"signature_name": "multi", "instances": [{"a": [1, 2], "b": [1, 2], "c": 1}]},
        400,
        "does not have named input: c",
    ),
    (
        "POST",
        "/v1/models/multi:predict",
        {"signature_name": "multi", "inputs": {"a": [[1, 2]]}},
        400,
        "Missing named input: b in 'inputs' object.",
    ),
    (
        "POST",
        "/v1/models/multi:predict",
        {"signature_name": "multi", "inputs": [[1, 2]]},
        400,
        "inputs is a plain value/list, but expecting an object as multiple input tensors",
    ),
    (
        "POST",
        "/v1/models/multi:predict",
        {"signature_name": "multi", "inputs": {"a": [[1, 2], [3]], "b": [[1, 2], [3, 4]]}},
        400,
        "Encountered list at unexpected size: 1 at level: 1 expected size: 2",
    ),
    (
        "POST",
        "/v1/models/multi:predict",
        {"signature_name": "multi", "inputs": {"a": [["x", 2]], "b": [[1, 2]]}},
        400,
        'JSON Value: "x" Type: String is not of expected type: float',
    ),
    (
        "POST",
        "/v1/models/multi:predict",
        {"signature_name": "ints", "instances": [[1.5, 2, 3]]},
        400,
        "JSON Value: 1.5 Type: Number is not of expected type: int32",
    ),
    ("POST", "/v1/models/mnist:predict", {"instances": [[1, 2, 3]]}, 400, "shape"),
    (
        "POST",
        "/v1/models/multi:classify",
        {"signature_name": "classify_x"},
        400,
        "When method is classify, key 'examples' is expected and was not found",
    ),
    (
        "POST",
        "/v1/models/multi:classify",
        {"signature_name": "classify_x", "examples": []},
        400,
        "'examples' value is an empty array",
    ),
    (
        "POST",
        "/v1/models/multi:classify",
        {"signature_name": "classify_x", "examples": [[1]]},
        400,
        "Example must be JSON object but got JSON Array",
    ),
    (
        "POST",
        "/v1/models/multi:classify",
        {"signature_name": "classify_x", "examples": [{"x": [1, "a"]}]},
        400,
        "Unexpected element type in feature: x expecting type: int64",
    ),
    (
        "POST",
        "/v1/models/multi:classify",
        {"signature_name": "classify_x", "examples": [{"x": None}]},
        400,
        "Feature: x has element with unexpected JSON type: Null",
    ),
    (
        "POST",
        "/v1/models/mnist:classify",
        {"examples": [{"x": [1.0, 2.0]}]},
        400,
        "Expected one input Tensor of type DT_STRING",
    ),
    # issue 10 item 5: each of these was a 500 with a traceback
    (
        "POST",
        "/v1/models/mnist:predict",
        b'{"instances": ' + b"[" * 66 + b"1" + b"]" * 66 + b"}",
        400,
        "is a list nested 66 deep: a tensor has at most 64 dimensions",
    ),
    (
        "POST",
        "/v1/models/mnist:predict",
        b'{"instances": ' + b"[" * 950 + b"1" + b"]" * 950 + b"}",
        400,
        "nested 950 deep",
    ),
    (
        "POST",
        "/v1/models/mnist:predict",
        b'{"instances": [' + b"9" * 5000 + b"]}",
        400,
        "Number too big to be stored in double: 99999999999999999999... (5000 characters)",
    ),
    (
        "POST",
        "/v1/models/multi:predict",
        b'{"signature_name": "multi", "inputs": {"a": [[' + b"9" * 400 + b', 1]], "b": [[1, 1]]}}',
        400,
        "Number too big to be stored in double: 99999999999999999999... (400 characters)",
    ),
    (
        "POST",
        "/v1/models/multi:classify",
        {"signature_name": "classify_x", "examples": [{"x": {"b64": "a"}}]},
        400,
        'Unable to base64 decode: "a"',
    ),
    (
        "POST",
        "/v1/models/multi:regress",
        {"signature_name": "regress_x", "context": {"x": [{"b64": "a"}]}, "examples": [{}]},
        400,
        'Unable to base64 decode: "a"',
    ),
    (
        "POST",
        "/v1/models/multi:classify",  # beyond int64 a literal is a double, as rapidjson
        b'{"signature_name": "classify_x", "examples": [{"x": [-99999999999999999999999, 1]}]}',
        400,
        "Unexpected element type in feature: x expecting type: float",
    ),
    (
        "POST",
        "/v1/models/multi:classify",
        b'{"signature_name": "classify_x", "examples": [{"x": "\\ud800"}]}',
        400,
        'JSON Value: "\\ud800" is not valid UTF-8',
    ),
    # a feature name or context key that is a lone surrogate (was a 500: UnicodeEncodeError)
    (
        "POST",
        "/v1/models/multi:classify",
        b'{"signature_name": "classify_x", "examples": [{"\\ud800": 1}]}',
        400,
        'Feature name: "\\ud800" is not valid UTF-8',
    ),
    (
        "POST",
        "/v1/models/multi:regress",
        b'{"signature_name": "regress_x", "context": {"\\udc00x": 1}, "examples": [{}]}',
        400,
        'Feature name: "\\udc00x" is not valid UTF-8',
    ),
    # only ASCII digits are a version (Arabic-Indic 7 was served as version 7)
    (
        "POST",
        "/v1/models/multi/versions/%D9%A7:regress",
        {"examples": [{}]},
        400,
        "Malformed request: POST /v1/models/multi/versions/%D9%A7:regress",
    ),
    # the name is percent-decoded once, as TF Serving does (was twice: %2541 -> A)
    ("GET", "/v1/models/%2541", None, 404, "Could not find any versions of model %41"),
    (
        "POST",
        "/v1/models/a%2Fb:predict",
        {"instances": [1]},
        404,
        "Servable not found for request: Latest(a/b)",
    ),
]


@pytest.mark.parametrize(
    "method, path, body, status, message", ERRORS, ids=[f"{e[3]}-{e[4][:40]}" for e in ERRORS]
)
def test_error_answers(server, method, path, body, status, message):
    if method == "GET":
        r = httpx.get(server.url + path, timeout=30)
    else:
        r = _post(server, path, body)
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    assert message in r.json()["error"]


def test_paths_outside_v1_are_a_bare_404(server):
    r = httpx.get(f"{server.url}/v2/models/mnist")
    assert r.status_code == 404 and r.content == b""


def test_body_limit_and_gzip(server):
    big = {"instances": [IMAGE.tolist()] * 150}  # about 2.5 MB of JSON, over the 1 MB limit
    r = _post(server, "/v1/models/mnist:predict", big)
    assert r.status_code == 413 and "--max_request_bytes" in r.json()["error"]
    small = json.dumps({"instances": [IMAGE.tolist()]}).encode()
    r = _post(
        server,
        "/v1/models/mnist:predict",
        gzip.compress(small),
        headers={"Content-Encoding": "gzip"},
    )
    assert r.status_code == 200 and len(r.json()["predictions"]) == 1


def test_b64_strings_and_nan(server):
    # b64 is only valid for string inputs: for a float input it is a type error
    r = _post(
        server,
        "/v1/models/mnist:predict",
        {"instances": [{"b64": base64.b64encode(b"x").decode()}]},
    )
    assert (
        r.status_code == 400 and "Type: Object is not of expected type: float" in r.json()["error"]
    )
    r = _post(
        server,
        "/v1/models/multi:predict",
        '{"signature_name": "multi", "inputs": {"a": [[NaN, 1]], "b": [[1, 1]]}}',
    )
    assert r.status_code == 200 and "NaN" in r.text  # NaN in, bare NaN token out


def test_prometheus_metrics_and_readiness(server):
    _post(server, "/v1/models/mnist:predict", {"instances": [IMAGE.tolist()]})
    _post(server, "/v1/models/half:predict", {"instances": [1]})
    page = httpx.get(f"{server.url}/monitoring/prometheus/metrics")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/plain")
    text = page.text
    assert "# TYPE :tensorflow:serving:request_count counter" in text
    assert ':tensorflow:serving:request_count{model_name="mnist",status="OK"}' in text
    # an unknown model is counted under one name, whatever the client calls it
    assert ':tensorflow:serving:request_count{model_name="<unknown>",status="NOT_FOUND"}' in text
    assert 'model_name="half"' not in text
    assert 'request_latency_count{API="predict",entrypoint="REST",model_name="mnist"}' in text
    assert httpx.get(f"{server.url}/readyz").json() == {"ready": True}


def test_integers_beyond_int64_are_doubles_as_rapidjson_reads_them(server):
    # TF Serving's parser stores such a literal as a double: a float feature, not an error
    r = _post(
        server,
        "/v1/models/multi:classify",
        b'{"signature_name": "classify_x", "examples": [{"x": [-99999999999999999999999, 1.5]}]}',
    )
    assert r.status_code == 200, r.text
    r = _post(
        server, "/v1/models/multi:predict", {"signature_name": "ints", "instances": [[2**63, 2, 3]]}
    )  # not an int32
    assert r.status_code == 400 and "9223372036854775808 Type: Number" in r.json()["error"]
