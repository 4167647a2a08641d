"""export: numbered versions written atomically; exports load with no strategy and predict
what the model predicts; `mirrorfit export` and `mirrorfit evaluate` on the CLI."""

import json
import threading

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import run_cli
from mirrorfit.errors import ConfigError
from mirrorfit.export import export_saved_model, save_keras, versions
from mirrorfit.models import mlp


@pytest.fixture(scope="module")
def model():
    keras.utils.set_random_seed(0)
    return mlp()


def _pixels(n=5):
    return np.random.default_rng(0).integers(0, 256, (n, 28, 28)).astype(np.uint8)


@pytest.mark.parametrize("preprocessing", [False, True])
def test_export_predicts_like_the_model(tmp_path, model, preprocessing):
    path = export_saved_model(model, tmp_path / "m", preprocessing=preprocessing)
    assert path.name == "0001"
    x = _pixels()
    expected = model(x / 255.0).numpy()
    feed = x if preprocessing else (x / 255.0).astype(np.float32)
    sig = tf.saved_model.load(str(path)).signatures["serving_default"]
    assert list(sig.structured_input_signature[1]) == ["images"]
    assert sig.structured_input_signature[1]["images"].dtype == (
        tf.uint8 if preprocessing else tf.float32)
    np.testing.assert_allclose(sig(images=tf.constant(feed))["probabilities"], expected,
                               rtol=1e-5, atol=1e-6)
    layer = keras.layers.TFSMLayer(str(path), call_endpoint="serving_default")
    np.testing.assert_allclose(layer(tf.constant(feed))["probabilities"], expected,
                               rtol=1e-5, atol=1e-6)


def test_versions_count_up_and_ignore_other_names(tmp_path, model):
    (tmp_path / "m" / "notes").mkdir(parents=True)
    (tmp_path / "m" / "0007").mkdir()
    assert export_saved_model(model, tmp_path / "m").name == "0008"
    assert versions(tmp_path / "m") == [7, 8]


def test_a_poller_never_sees_a_partial_version(tmp_path, model):
    base = tmp_path / "m"
    base.mkdir()
    seen, bad, stop = set(), [], threading.Event()

    def poll():
        while not stop.is_set():
            for v in versions(base):
                d = base / f"{v:04d}"
                if not ((d / "saved_model.pb").is_file() and (d / "variables").is_dir()
                        and any((d / "variables").glob("variables.data-*"))):
                    bad.append(v)
                seen.add(v)

    t = threading.Thread(target=poll)
    t.start()
    try:
        for _ in range(3):
            export_saved_model(model, base)
    finally:
        stop.set()
        t.join()
    assert not bad and {1, 2} <= seen  # it watched during the writes and saw no partial one
    assert versions(base) == [1, 2, 3]


def test_save_keras_is_atomic_and_checked(tmp_path, model):
    path = save_keras(model, tmp_path / "m.keras")
    assert [p.name for p in tmp_path.iterdir()] == ["m.keras"]
    np.testing.assert_allclose(keras.saving.load_model(path)(_pixels() / 255.0),
                               model(_pixels() / 255.0), rtol=1e-6)
    with pytest.raises(ConfigError, match="must end in .keras"):
        save_keras(model, tmp_path / "m.h5")


@pytest.mark.slow
def test_cli_export_and_evaluate_agree_with_training(tmp_path, mnist_dir):
    d, models = tmp_path / "ckpt", tmp_path / "models" / "mnist"
    m = tmp_path / "m.json"
    assert run_cli("train", "--train-examples", "4096", "--epochs", "2", "--checkpoint-dir",
                   str(d), "--export-dir", str(models), "--export-preprocessing",
                   "--metrics-out", str(m), "--no-progress").returncode == 0
    trained = json.loads(m.read_text())
    assert trained["export_path"].endswith("0001")
    exp = run_cli("export", "--checkpoint-dir", str(d), "--export-dir", str(models))
    assert exp.returncode == 0 and (models / "0002" / "saved_model.pb").is_file()
    for source in (["--saved-model", str(models)], ["--saved-model", str(models / "0001")],
                   ["--checkpoint-dir", str(d)]):
        ev = run_cli("evaluate", *source, "--metrics-out", str(tmp_path / "e.json"))
        assert ev.returncode == 0, ev.stderr[-2000:]
        result = json.loads((tmp_path / "e.json").read_text())
        assert result["examples"] == 10000
        assert result["test_accuracy"] == pytest.approx(trained["test_accuracy"], abs=1e-4)
    missing = run_cli("evaluate", "--checkpoint-dir", str(tmp_path / "none"))
    assert missing.returncode == 2 and "no checkpoint in" in missing.stderr
