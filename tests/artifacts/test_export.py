"""export: numbered versions written atomically; exports load with no strategy and predict
what the model predicts; `mirrorfit export` and `mirrorfit evaluate` on the CLI."""

import json
import shutil
import threading

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import run_cli
from mirrorfit.errors import ConfigError
from mirrorfit.artifacts.export import export_saved_model, versions
from mirrorfit.artifacts.keras_file import save_keras
from mirrorfit.models.build import mlp


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
        tf.uint8 if preprocessing else tf.float32
    )
    np.testing.assert_allclose(
        sig(images=tf.constant(feed))["probabilities"], expected, rtol=1e-5, atol=1e-6
    )
    layer = keras.layers.TFSMLayer(str(path), call_endpoint="serving_default")
    np.testing.assert_allclose(
        layer(tf.constant(feed))["probabilities"], expected, rtol=1e-5, atol=1e-6
    )


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
                if not (
                    (d / "saved_model.pb").is_file()
                    and (d / "variables").is_dir()
                    and any((d / "variables").glob("variables.data-*"))
                ):
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
    np.testing.assert_allclose(
        keras.saving.load_model(path)(_pixels() / 255.0), model(_pixels() / 255.0), rtol=1e-6
    )
    with pytest.raises(ConfigError, match="must end in .keras"):
        save_keras(model, tmp_path / "m.h5")


@pytest.mark.slow
def test_cli_export_and_evaluate_agree_with_training(tmp_path, mnist_dir):
    d, models = tmp_path / "ckpt", tmp_path / "models" / "mnist"
    m = tmp_path / "m.json"
    assert (
        run_cli(
            "train",
            "--train-examples",
            "4096",
            "--epochs",
            "2",
            "--checkpoint-dir",
            str(d),
            "--export-dir",
            str(models),
            "--export-preprocessing",
            "--metrics-out",
            str(m),
            "--no-progress",
        ).returncode
        == 0
    )
    trained = json.loads(m.read_text())
    assert trained["export_path"].endswith("0001")
    exp = run_cli("export", "--checkpoint-dir", str(d), "--export-dir", str(models))
    assert exp.returncode == 0 and (models / "0002" / "saved_model.pb").is_file()
    for source in (
        ["--saved-model", str(models)],
        ["--saved-model", str(models / "0001")],
        ["--checkpoint-dir", str(d)],
    ):
        ev = run_cli("evaluate", *source, "--metrics-out", str(tmp_path / "e.json"))
        assert ev.returncode == 0, ev.stderr[-2000:]
        result = json.loads((tmp_path / "e.json").read_text())
        assert result["examples"] == 10000
        assert result["test_accuracy"] == pytest.approx(trained["test_accuracy"], abs=1e-4)
    missing = run_cli("evaluate", "--checkpoint-dir", str(tmp_path / "none"))
    assert missing.returncode == 2 and "no checkpoint in" in missing.stderr


@pytest.mark.slow
@pytest.mark.parametrize("shard", ["none", "all"])
def test_cli_exports_a_compiled_models_checkpoint(tmp_path, mnist_dir, shard):
    """A compiled --model trained on JAX (whose --export-dir is refused, pointing at mirrorfit
    export) exports from its checkpoint, and evaluate scores it as train did: Keras's
    save_weights under none, Orbax's split state under all. On main both said "no checkpoint
    in DIR; train with --checkpoint-dir DIR first"; on f2d4a0f its Dropout's seed state
    (uint32 on JAX, int64 where TensorFlow rebuilds it) stopped the export."""
    d, models = tmp_path / "ckpt", tmp_path / "models" / "digits"
    trained = run_cli(
        *("train", "--backend", "jax", "--replicas", "2", "--shard", shard),
        *("--model", "keras_models:digits_dropout", "--data-dir", str(mnist_dir)),
        *("--train-examples", "640", "--epochs", "1", "--checkpoint-dir", str(d)),
        *("--save-keras", str(tmp_path / "trained.keras"), "--no-progress"),
        *("--metrics-out", str(tmp_path / "m.json")),
    )
    assert trained.returncode == 0, trained.stderr[-3000:]
    held = sorted(p.name for p in (d / "epoch-000001").iterdir())
    assert ("state" in held) == (shard == "all") and ("state.weights.h5" in held) != (
        shard == "all"
    )
    unnamed = run_cli("export", "--checkpoint-dir", str(d), "--export-dir", str(models))
    assert unnamed.returncode == 2 and "pass --model package.module:function" in unnamed.stderr
    scored = run_cli(
        *("evaluate", "--checkpoint-dir", str(d), "--model", "keras_models:digits_dropout"),
        *("--data-dir", str(mnist_dir), "--metrics-out", str(tmp_path / "e.json")),
    )
    assert scored.returncode == 0, scored.stderr[-3000:]
    # scored by its compile on the test split as train fed it (uint8 pixels): train's figures
    test = json.loads((tmp_path / "m.json").read_text())["test"]
    figures = json.loads((tmp_path / "e.json").read_text())
    assert figures["examples"] == 10000
    assert figures["test_accuracy"] == pytest.approx(test["accuracy"], abs=1e-4)
    assert figures["test_loss"] == pytest.approx(test["loss"], rel=1e-4)
    exp = run_cli(
        *("export", "--checkpoint-dir", str(d), "--model", "keras_models:digits_dropout"),
        *("--export-dir", str(models)),
    )
    assert exp.returncode == 0, exp.stderr[-3000:]
    assert "exported epoch-000001 of" in exp.stdout
    x = _pixels(8).astype(np.float32)
    expected = keras.saving.load_model(tmp_path / "trained.keras")(x).numpy()
    served = tf.saved_model.load(str(models / "0001")).signatures["serving_default"]
    (got,) = served(**{served.structured_input_signature[1].popitem()[0]: x}).values()
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", ["jax", "tensorflow"])
def test_a_built_in_models_fit_checkpoint_exports_without_model(tmp_path, mnist_dir, backend):
    """mirrorfit's mlp trained through mirrorfit.fit (compiled in a user's function): its
    checkpoint records the model's name, so export rebuilds it as the old format's did, with
    no --model (no user code runs: a built-in model). On 2aa0a29: "pass --model"."""
    d, models = tmp_path / "ckpt", tmp_path / "models" / "mlp"
    trained = run_cli(
        *("train", "--backend", backend, "--model", "keras_models:compiled_mlp"),
        *("--data-dir", str(mnist_dir), "--train-examples", "640", "--epochs", "1"),
        *("--checkpoint-dir", str(d), "--save-keras", str(tmp_path / "trained.keras")),
        "--no-progress",
    )
    assert trained.returncode == 0, trained.stderr[-3000:]
    exp = run_cli("export", "--checkpoint-dir", str(d), "--export-dir", str(models))
    assert exp.returncode == 0, exp.stderr[-3000:]
    # evaluate scores by the compile, which the checkpoint does not keep: one line saying so
    # (on e3acabe: "--model None returns a model that is not compiled (trained with --loss)")
    scored = run_cli("evaluate", "--checkpoint-dir", str(d), "--data-dir", str(mnist_dir))
    assert scored.returncode == 2, scored.stderr[-3000:]
    assert scored.stderr.strip() == (
        f"mirrorfit: error: {d} holds mirrorfit's mlp, trained through mirrorfit.fit with a "
        "compile the checkpoint does not keep; mirrorfit evaluate scores a model by its "
        "compile: pass --model package.module:function returning it compiled as it trained"
    )
    x = _pixels(8).astype(np.float32)
    expected = keras.saving.load_model(tmp_path / "trained.keras")(x).numpy()
    served = tf.saved_model.load(str(models / "0001")).signatures["serving_default"]
    (got,) = served(**{served.structured_input_signature[1].popitem()[0]: x}).values()
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", ["jax", "tensorflow"])
def test_evaluate_scores_a_compiled_models_checkpoint_on_its_backend(tmp_path, mnist_dir, backend):
    """A saturated softmax's loss is the backend's own (clipped on JAX, from the logits on
    TensorFlow): evaluate scores on the backend that trained it, as train's own test figures.
    On 73c34ab a JAX run's checkpoint was scored on TensorFlow, a loss several times train's."""
    d = tmp_path / "ckpt"
    trained = run_cli(
        *("train", "--backend", backend, "--model", "keras_models:digits_saturated"),
        *("--data-dir", str(mnist_dir), "--train-examples", "256", "--epochs", "1"),
        *("--checkpoint-dir", str(d), "--metrics-out", str(tmp_path / "m.json")),
    )
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert json.loads((d / "epoch-000001" / "meta.json").read_text())["backend"] == backend
    scored = run_cli(
        *("evaluate", "--checkpoint-dir", str(d), "--model", "keras_models:digits_saturated"),
        *("--data-dir", str(mnist_dir), "--metrics-out", str(tmp_path / "e.json")),
    )
    assert scored.returncode == 0, scored.stderr[-3000:]
    test = json.loads((tmp_path / "m.json").read_text())["test"]
    figures = json.loads((tmp_path / "e.json").read_text())
    assert figures["test_loss"] == pytest.approx(test["loss"], rel=1e-4)
    assert figures["test_accuracy"] == pytest.approx(test["accuracy"], abs=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize(
    "model, flags",
    [
        # built for --input-shape/--num-classes: rebuilt for them (on f2d4a0f: "holds another
        # model's checkpoint", the (784, 10) kernel of its defaults)
        ("digits", ("--data", "synthetic", "--input-shape", "8,8", "--num-classes", "3")),
        # no Input, not compiled (--loss): built for the shape it trained on (on f2d4a0f: an
        # AttributeError traceback, then "2 weights where this model has 0")
        ("digits_unbuilt", ("--loss", "sparse_categorical_crossentropy")),
    ],
)
def test_cli_exports_a_model_built_for_its_data(tmp_path, mnist_dir, model, flags):
    d, models = tmp_path / "ckpt", tmp_path / "models" / "m"
    source = () if "synthetic" in flags else ("--data-dir", str(mnist_dir))
    trained = run_cli(
        *("train", "--backend", "jax", "--model", f"keras_models:{model}", *flags, *source),
        *("--train-examples", "256", "--epochs", "1"),
        *("--checkpoint-dir", str(d), "--save-keras", str(tmp_path / "t.keras")),
    )
    assert trained.returncode == 0, trained.stderr[-3000:]
    exp = run_cli(
        *("export", "--checkpoint-dir", str(d), "--model", f"keras_models:{model}"),
        *("--export-dir", str(models)),
    )
    assert exp.returncode == 0, exp.stderr[-3000:]
    trained_model = keras.saving.load_model(tmp_path / "t.keras")
    x = np.random.default_rng(1).integers(0, 256, (4, *trained_model.inputs[0].shape[1:]))
    x = x.astype(np.float32)
    served = tf.saved_model.load(str(models / "0001")).signatures["serving_default"]
    (got,) = served(**{served.structured_input_signature[1].popitem()[0]: x}).values()
    np.testing.assert_allclose(got.numpy(), trained_model(x).numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_cli_exports_the_textbook_cnn_trained_sharded_on_jax(tmp_path, mnist_dir):
    """The built-in CNN's Dropout keeps its seed state as uint32 on JAX; TensorFlow rebuilds
    it as int64. On f2d4a0f the export of its --shard all checkpoint said "state/non_trainable/0
    is uint32, not seed_generator/seed_generator_state's int64; delete that folder"."""
    d = tmp_path / "ckpt"
    trained = run_cli(
        *("train", "--backend", "jax", "--model", "cnn", "--shard", "all", "--replicas", "2"),
        *("--data-dir", str(mnist_dir), "--train-examples", "256", "--epochs", "1"),
        *("--checkpoint-dir", str(d), "--no-progress"),
    )
    assert trained.returncode == 0, trained.stderr[-3000:]
    exp = run_cli("export", "--checkpoint-dir", str(d), "--export-dir", str(tmp_path / "m"))
    assert exp.returncode == 0, exp.stderr[-3000:]
    assert (tmp_path / "m" / "0001" / "saved_model.pb").is_file()


# -- names, full disks, crashes, power loss (issue 10) -----------------------------------------
def _fsync_recorder(monkeypatch):
    """Record the path of everything fsynced (and the order), still fsyncing it."""
    import os

    done, real = [], os.fsync

    def fsync(fd):
        done.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return done


def test_odd_names_and_a_file_named_like_a_version(tmp_path, model):
    base = tmp_path / "m"
    (base / "²").mkdir(parents=True)  # str.isdigit() says yes, int() says no
    (base / "0003").mkdir()
    (base / "0004").write_text("not a version")  # a file: a version cannot be renamed onto it
    assert versions(base) == [3]
    assert export_saved_model(model, base).name == "0005"
    assert versions(base) == [3, 5]


def test_a_full_disk_says_so_and_adds_nothing(tmp_path, model, monkeypatch):
    from mirrorfit.errors import StorageError

    base = tmp_path / "m"
    export_saved_model(model, base)

    def save(obj, path, **kwargs):  # as TensorFlow reports ENOSPC, after a partial write
        (tmp_path / "m" / str(path).rsplit("/", 1)[-1] / "half").mkdir(parents=True)
        raise tf.errors.ResourceExhaustedError(
            None, None, f"{path}/variables; No space left on device"
        )

    monkeypatch.setattr(tf.saved_model, "save", save)
    with pytest.raises(StorageError, match="disk full while writing the export") as e:
        export_saved_model(model, base)
    assert "memory" not in str(e.value)
    assert sorted(p.name for p in base.iterdir()) == ["0001"]  # no temp folder left either


def test_exports_and_keras_files_are_fsynced_before_the_rename(tmp_path, model, monkeypatch):
    done = _fsync_recorder(monkeypatch)
    path = export_saved_model(model, tmp_path / "m")
    tmp = [p for p in done if "/.tmp-" in p][0].split("/.tmp-")[1].split("/")[0]
    synced = {p.split(f"/.tmp-{tmp}/", 1)[1] for p in done if f"/.tmp-{tmp}/" in p}
    files = {str(p.relative_to(path)) for p in path.rglob("*") if p.is_file()}
    assert files and files <= synced
    assert done[-1] == str(tmp_path / "m")  # the folder, after the rename

    done.clear()
    save_keras(model, tmp_path / "k.keras")
    assert any(p.endswith(".keras") and "/.k.tmp-" in p for p in done)
    assert done[-1] == str(tmp_path)


def test_only_our_own_temps_of_crashed_writers_are_removed(tmp_path, model):
    import os
    import subprocess
    import sys

    from mirrorfit import _io

    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    ).stdout.strip()
    host, rand = _io.temp_tag().split("-")[0], "0" * 32
    other_host = format(int(host, 16) ^ 1, "08x")
    base = tmp_path / "m"
    (base / f".tmp-{host}-{dead}-{rand}" / "variables").mkdir(parents=True)  # writer gone
    kept = [
        f".tmp-{host}-{os.getppid()}-{rand}",  # a live process's export in progress
        f".tmp-{other_host}-{dead}-{rand}",  # another host's (NFS): its pid means nothing here
        ".tmp-deploy-staging",
        ".tmp-99999",
        f".tmp-{host}-{dead}-{rand}x",
    ]  # not ours
    for name in kept:
        (base / name).mkdir()
    (tmp_path / f".k.tmp-{host}-{dead}-{rand}.keras").write_text("half")
    # A stem with glob characters matches only its own temps, not ".m1.tmp-..." (glob "[1]").
    (tmp_path / f".m1.tmp-{host}-{dead}-{rand}.keras").write_text("another file's")
    export_saved_model(model, base)
    save_keras(model, tmp_path / "k.keras")
    save_keras(model, tmp_path / "m[1].keras")
    assert sorted(p.name for p in base.iterdir()) == sorted([*kept, "0001"])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["k.keras", "m", "m[1].keras", f".m1.tmp-{host}-{dead}-{rand}.keras"]
    )


def test_versions_past_int64_are_refused_and_the_server_agrees(tmp_path, model):
    from mirrorfit.errors import StorageError
    from mirrorfit.serving.disk import version_folders

    base = tmp_path / "m"
    (base / "99999999999999999999").mkdir(parents=True)  # TF Serving ignores it (int64)
    with pytest.raises(StorageError, match="past the largest TF Serving reads"):
        export_saved_model(model, base)
    assert [p.name for p in base.iterdir()] == ["99999999999999999999"]  # nothing written
    (base / "99999999999999999999").rmdir()
    (base / str(2**63 - 1)).mkdir()  # the largest version: the next one has no number
    with pytest.raises(StorageError, match=f"after {base / str(2**63 - 1)} would be {2**63}"):
        export_saved_model(model, base)
    (base / "0007").mkdir()
    for name in ("٣", "²", "7\n", str(2**63)):
        (base / name).mkdir()
    # One parser: what export counts as a version is what the server serves.
    assert versions(base) == sorted(version_folders(base)) == [7, 2**63 - 1]


def test_a_stop_before_the_commit_adds_no_version(tmp_path, model):
    class Stop(Exception):
        pass

    def stop():
        raise Stop

    with pytest.raises(Stop):
        export_saved_model(model, tmp_path / "m", before_commit=stop)
    with pytest.raises(Stop):
        save_keras(model, tmp_path / "k.keras", before_commit=stop)
    assert [p.name for p in tmp_path.iterdir()] == ["m"] and not list((tmp_path / "m").iterdir())


def test_class_names_go_into_the_export_and_serve_answers_with_them(tmp_path):
    """A model trained on an image folder (cat, dög, zebra) exported nothing of its class
    names (no asset, no metadata; --metrics-out alone had them). Now: an asset
    (assets/class_names.txt, one per line, label i on line i), a classify signature that
    returns them as TF Serving's classify does, a `classes` signature for predict, and
    /metadata lists them; `mirrorfit export` from the checkpoint keeps them too."""
    import httpx

    from data_fixtures import mnist, png
    from mirrorfit import cli
    from serving_support import Server

    names = ["cat", "dög", "zebra"]
    x, _ = mnist(12)
    for i in range(12):
        folder = tmp_path / "photos" / names[i % 3]
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i}.png").write_bytes(png(x[i]))
    proc = run_cli(
        "train",
        "--data",
        str(tmp_path / "photos"),
        "--epochs",
        "1",
        "--batch-size",
        "4",
        "--no-progress",
        "--export-dir",
        str(tmp_path / "models" / "pets"),
        "--checkpoint-dir",
        str(tmp_path / "ckpt"),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    path = tmp_path / "models" / "pets" / "0001"
    assert (path / "assets" / "class_names.txt").read_text("utf-8") == "cat\ndög\nzebra\n"
    from tensorflow.core.protobuf import saved_model_pb2

    graph = saved_model_pb2.SavedModel.FromString((path / "saved_model.pb").read_bytes())
    sigs = graph.meta_graphs[0].signature_def
    assert sigs["classify"].method_name == "tensorflow/serving/classify"
    assert any(a.filename == "class_names.txt" for a in graph.meta_graphs[0].asset_file_def)

    assert (
        cli.main(
            [
                "export",
                "--checkpoint-dir",
                str(tmp_path / "ckpt"),
                "--export-dir",
                str(tmp_path / "models" / "pets"),
            ]
        )
        == 0
    )
    again = tmp_path / "models" / "pets" / "0002"
    assert (again / "assets" / "class_names.txt").read_text("utf-8") == "cat\ndög\nzebra\n"

    image = (x[0, :, :, None] / 255.0).astype(np.float32)  # 28x28x1, as the model takes it
    server = Server(
        [f"--model_base_path={tmp_path / 'models' / 'pets'}", "--model_name=pets"], tmp_path
    )
    try:
        meta = httpx.get(f"{server.url}/v1/models/pets/metadata", timeout=30).json()
        assert meta["metadata"]["class_names"] == names, meta
        r = httpx.post(
            f"{server.url}/v1/models/pets:classify",
            timeout=30,
            json={
                "signature_name": "classify",
                "examples": [{"images": image.reshape(-1).tolist()}],
            },
        )
        assert r.status_code == 200, r.text
        (result,) = r.json()["results"]
        assert [label for label, _ in result] == names
        probabilities = httpx.post(
            f"{server.url}/v1/models/pets:predict", timeout=30, json={"instances": [image.tolist()]}
        ).json()["predictions"]
        np.testing.assert_allclose([s for _, s in result], probabilities[0], rtol=1e-5)
        r = httpx.post(
            f"{server.url}/v1/models/pets:predict",
            timeout=30,
            json={"signature_name": "classes", "instances": [image.tolist()]},
        )
        assert r.status_code == 200, r.text
        (row,) = r.json()["predictions"]
        assert row["label"] == names[int(np.argmax(probabilities[0]))]
        assert row["classes"] == names
    finally:
        server.stop()


def test_a_model_the_checkpoints_shapes_cannot_rebuild_is_one_line(tmp_path, mnist_dir):
    """Checkpoints without the recorded shapes (before 2026-12-05, or a meta.json damaged and
    resealed) cannot rebuild a model built for its data: one line naming the checkpoints, not
    the model (on 5758da4: "the function raised TypeError: ... missing 1 required positional
    argument", or "holds another model's checkpoint (2 weights where this model has 0)"). A
    model that cannot be built for the recorded shape: one line (a Keras traceback)."""
    from mirrorfit.artifacts.checksums import sealed

    d = tmp_path / "ckpt"
    trained = run_cli(
        *("train", "--backend", "jax", "--model", "keras_models:digits_unbuilt"),
        *("--loss", "sparse_categorical_crossentropy", "--data-dir", str(mnist_dir)),
        *("--train-examples", "64", "--epochs", "1", "--checkpoint-dir", str(d)),
    )
    assert trained.returncode == 0, trained.stderr[-3000:]

    def exported(model: str, where) -> str:
        proc = run_cli(
            *("export", "--checkpoint-dir", str(where), "--model", f"keras_models:{model}"),
            *("--export-dir", str(tmp_path / "models" / model)),
        )
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
        return proc.stderr.strip().splitlines()[-1]

    said = exported("conv_unbuilt", d)
    assert "--model keras_models:conv_unbuilt cannot be built for the input shape (28, 28)" in said
    old = tmp_path / "old"
    shutil.copytree(d, old)
    meta_file = old / "epoch-000001" / "meta.json"
    meta = json.loads(meta_file.read_text())
    del meta["shapes"], meta["crc"]
    meta_file.write_text(json.dumps(sealed(meta)))
    for model, needle in (
        ("digits_for_the_data", "which --model keras_models:digits_for_the_data needs"),
        ("digits_unbuilt", "and --model keras_models:digits_unbuilt declares no keras.Input"),
    ):
        said = exported(model, old)
        assert f"the checkpoints in {old} do not record the shapes" in said and needle in said


@pytest.mark.slow
def test_an_application_named_otherwise_by_keras_exports_without_model(tmp_path):
    """keras.applications.MobileNetV2 names its model mobilenetv2_1.00_224: the checkpoint
    records the --model it was given, so export rebuilds it without --model (on the one-loop
    branch's 6c5b388: "pass --model package.module:function")."""
    d, models = tmp_path / "ckpt", tmp_path / "models" / "m"
    trained = run_cli(
        *("train", "--backend", "jax", "--model", "MobileNetV2", "--data", "synthetic"),
        *("--input-shape", "32,32,3", "--num-classes", "3", "--train-examples", "32"),
        *("--global-batch-size", "16", "--epochs", "1", "--checkpoint-dir", str(d)),
        "--no-progress",
    )
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert json.loads((d / "epoch-000001" / "meta.json").read_text())["built_in"] == "MobileNetV2"
    exp = run_cli("export", "--checkpoint-dir", str(d), "--export-dir", str(models))
    assert exp.returncode == 0, exp.stderr[-3000:]
    assert (models / "0001" / "saved_model.pb").is_file()
