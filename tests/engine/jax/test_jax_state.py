"""engine.jax.state: a JAX checkpoint is exported by `mirrorfit export` where TensorFlow is (it
reads state.npz with NumPy) and `mirrorfit serve` answers, over REST and gRPC, with the
predictions of the model JAX trained; a damaged state.npz is set aside like TensorFlow's."""

import json
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from conftest import run_cli, run_isolated
from serving_support import Server

pytestmark = pytest.mark.slow
HERE = Path(__file__).parent


def test_a_jax_checkpoint_exported_and_served_answers_as_jax_predicts(tmp_path):
    train = run_cli(
        "train",
        "--backend",
        "jax",
        "--train-examples",
        "1024",
        "--optimizer",
        "adam",
        "--lr",
        "0.003",
        "--epochs",
        "1",
        "--no-progress",
        "--checkpoint-dir",
        str(tmp_path / "ckpt"),
        "--save-keras",
        str(tmp_path / "mlp.keras"),
        without_tensorflow=True,
    )
    assert train.returncode == 0, train.stderr[-3000:]
    assert (tmp_path / "ckpt" / "epoch-000001" / "state.weights.h5").is_file()
    export = run_cli(
        "export",
        "--checkpoint-dir",
        str(tmp_path / "ckpt"),
        "--export-dir",
        str(tmp_path / "models" / "mlp"),
    )
    assert export.returncode == 0, export.stderr[-3000:]
    assert "exported epoch-000001" in export.stdout, export.stdout
    want = run_isolated(HERE / "jax_predictions_driver.py", tmp_path / "mlp.keras")
    x, expected = np.array(want["x"], np.float32), np.array(want["p"])
    server = Server(
        [f"--model_base_path={tmp_path / 'models' / 'mlp'}", "--model_name=mlp"], tmp_path
    )
    try:
        rest = httpx.post(
            f"{server.url}/v1/models/mlp:predict", json={"instances": x.tolist()}, timeout=30
        ).json()["predictions"]
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "mlp"
        request.inputs["images"].CopyFrom(tf.make_tensor_proto(x))
        with grpc.insecure_channel(server.grpc_target) as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            grpc_out = tf.make_ndarray(stub.Predict(request, timeout=30).outputs["probabilities"])
    finally:
        server.stop()
    assert expected.shape == (8, 10) and expected.std() > 0.01
    assert np.abs(np.array(rest) - expected).max() < 1e-5
    assert np.abs(grpc_out - expected).max() < 1e-5


def test_a_damaged_jax_state_is_set_aside_and_the_previous_one_resumes(tmp_path):
    args = [
        "train",
        "--backend",
        "jax",
        "--model",
        "user_models:tiny",
        "--train-examples",
        "256",
        "--no-progress",
        "--checkpoint-dir",
        str(tmp_path / "c"),
    ]
    assert run_cli(*args, "--epochs", "2", without_tensorflow=True).returncode == 0
    newest = tmp_path / "c" / "epoch-000002"
    (newest / "state.weights.h5").write_bytes(b"\x89HDF\r\n not an h5 file any more")
    proc = run_cli(
        *args, "--epochs", "3", "--metrics-out", str(tmp_path / "m.json"), without_tensorflow=True
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "epoch-000002 cannot be read" in proc.stderr
    assert "resuming from the previous one, epoch-000001" in proc.stderr
    assert any(p.name.startswith("corrupt-epoch-000002") for p in (tmp_path / "c").iterdir())
    assert json.loads((tmp_path / "m.json").read_text())["steps"] == 24


class _Variable:
    """What read_arrays touches of a Keras variable: path, shape, dtype, assign."""

    def __init__(self, path, value):
        self.path, self.value = path, np.asarray(value)
        self.shape, self.dtype = self.value.shape, str(self.value.dtype)

    def assign(self, value):
        self.value = np.asarray(value, self.dtype)


def _state(tmp_path, **arrays):
    from mirrorfit.engine.jax.state import write_arrays

    write_arrays(
        tmp_path,
        {
            "model": [
                _Variable("w", np.ones((2, 3), np.float32)),
                _Variable("seed", np.array([7, 0], np.uint32)),
            ]
        },
    )
    with np.load(tmp_path / "state.npz") as f:
        saved = {k: f[k] for k in f.files}
    with open(tmp_path / "state.npz", "wb") as f:
        np.savez(f, **{**saved, **arrays})


@pytest.mark.parametrize(
    "key, bad",
    [
        ("model/0", np.full((2, 3), 5, np.int32)),
        ("model/0", np.ones((2, 3), np.float64)),
        ("model/0", np.ones((3,), np.float32)),
        ("model/1", np.array([1.5, 0], np.float32)),
        ("model/0", np.full((2, 3), 5, np.int8)),
        ("model/0", np.ones((2, 3), np.float16)),
    ],
    ids=[
        "int32-weights",
        "float64-weights",
        "other-shape-than-its-layout",
        "float-seed",
        "int8-weights (a safe cast)",
        "float16-weights (a safe cast)",
    ],
)
def test_arrays_not_of_the_variables_dtype_or_shape_are_damage_and_change_nothing(
    tmp_path, key, bad
):
    from mirrorfit.engine.jax.state import read_arrays

    _state(tmp_path, **{key: bad})
    variables = [
        _Variable("w", np.zeros((2, 3), np.float32)),
        _Variable("seed", np.zeros(2, np.int64)),
    ]
    with pytest.raises(ValueError, match="state.npz's model/"):
        read_arrays(tmp_path, {"model": variables})
    assert not variables[0].value.any() and not variables[1].value.any()  # nothing assigned


def test_a_safe_cast_is_read_as_exporting_a_jax_seed_state_on_tensorflow_needs(tmp_path):
    from mirrorfit.engine.jax.state import read_arrays

    _state(tmp_path)
    variables = [
        _Variable("w", np.zeros((2, 3), np.float32)),
        _Variable("seed", np.zeros(2, np.int64)),
    ]  # TensorFlow's seed dtype
    read_arrays(tmp_path, {"model": variables})
    assert variables[0].value.sum() == 6 and variables[1].value.tolist() == [7, 0]


def test_bfloat16_weights_are_read_back_as_written(tmp_path):
    """NumPy writes ml_dtypes' bfloat16 as raw 2-byte records (|V2); a model with a bf16 layer
    saved a checkpoint that neither resume nor export would read."""
    import ml_dtypes

    from mirrorfit.engine.jax.state import read_arrays, write_arrays

    weights = (np.arange(6).reshape(2, 3) / 4).astype(ml_dtypes.bfloat16)
    write_arrays(tmp_path, {"model": [_Variable("w", weights)]})
    target = _Variable("w", np.zeros((2, 3), ml_dtypes.bfloat16))
    read_arrays(tmp_path, {"model": [target]})
    assert target.value.dtype == ml_dtypes.bfloat16
    assert target.value.astype(np.float32).tolist() == weights.astype(np.float32).tolist()
    half = _Variable("w", np.zeros((2, 3), np.float16))  # the same 2 bytes, another type
    with pytest.raises(ValueError, match="state.npz's model/0 is"):
        read_arrays(tmp_path, {"model": [half]})
