"""A JAX run's checkpoint: exported by `mirrorfit export` where TensorFlow is and served by
`mirrorfit serve`, over REST and gRPC, with the predictions of the model JAX trained; a damaged
newest one is set aside and the previous one resumed."""

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
