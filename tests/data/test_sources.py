"""--data sources, in this process (one device): each trains like the same images from an npz,
the order and resume guarantees of files, and every bad input as one DataError line.

Fixtures are the first 2,000 MNIST training images written as a PNG folder, as TFRecords and as
an npz in the folder's order (small and lean: the whole module runs in ~30 s on 2 cores)."""

import hashlib
import os
from pathlib import Path

import numpy as np
import pytest

import mirrorfit
from conftest import run_cli
from data_fixtures import folder_order, mnist, png, write_png_folder, write_tfrecords
from mirrorfit.data.files import holdout
from mirrorfit.data.sources import load_data
from mirrorfit.errors import ConfigError, DataError

HERE = Path(__file__).parent
N = 2000  # training images in every fixture
BATCH = 50  # global batch: N is a multiple, so an epoch is every example


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The same 2,000 images as a PNG folder, 5 TFRecord shards, and an npz in the folder's
    order (what image_dataset_from_directory's layout lists: by class, then by file name)."""
    root = tmp_path_factory.mktemp("sources")
    x, y = mnist(N)
    write_png_folder(root / "png", x, y)
    write_tfrecords(root / "tfr", x, y, shards=5)
    order = folder_order(y)
    np.savez(root / "same.npz", x_train=x[order], y_train=y[order])
    return {
        "root": root,
        "png": str(root / "png"),
        "tfr": str(root / "tfr" / "*.tfrecord"),
        "npz": str(root / "same.npz"),
        "x": x,
        "y": y,
    }


def _batches(data, **kwargs):
    return [(x.numpy(), y.numpy()) for x, y in data.train.dataset(**kwargs)]


def _same(a, b):
    return len(a) == len(b) and all(
        np.array_equal(p[0].reshape(q[0].shape), q[0]) and np.array_equal(p[1], q[1])
        for p, q in zip(a, b)
    )


def test_image_folder_reads_the_npz_order_pixel_for_pixel(files, tmp_path):
    """Same images, same order (the seeded permutation of the folder's listing): the batches
    are identical, cached in memory or in a folder too, and a mid-epoch resume skips exactly."""
    npz = load_data(files["npz"], global_batch=BATCH, seed=7)
    folder = load_data(files["png"], global_batch=BATCH, seed=7)
    assert folder.input_shape == (28, 28, 1) and folder.num_classes == 10
    assert folder.class_names == tuple(str(c) for c in range(10))
    want = _batches(npz, start_epoch=0, epochs=2)
    assert _same(_batches(folder, start_epoch=0, epochs=2), want)
    for cache in ("memory", str(tmp_path / "cache")):
        cached = load_data(files["png"], global_batch=BATCH, seed=7, cache=cache)
        assert cached.fingerprint == folder.fingerprint  # the cache does not change the order
        assert _same(_batches(cached, start_epoch=1, epochs=2, skip=13), want[40 + 13 :])
    stored = list((tmp_path / "cache").glob("mirrorfit-cache-*.npy"))
    assert len(stored) == 1
    mtime = stored[0].stat().st_mtime_ns
    load_data(files["png"], global_batch=BATCH, seed=7, cache=str(tmp_path / "cache"))
    assert stored[0].stat().st_mtime_ns == mtime  # reused, not decoded again


def test_image_folder_workers_read_their_share_of_every_global_batch(files):
    data = load_data(files["png"], global_batch=BATCH, seed=3)
    whole = _batches(data, start_epoch=0, epochs=1)
    shares = [_batches(data, start_epoch=0, epochs=1, worker=w, workers=2) for w in (0, 1)]
    joined = [(np.concatenate([a[0], b[0]]), np.concatenate([a[1], b[1]])) for a, b in zip(*shares)]
    assert _same(joined, whole)


def _digests(batches):
    """One hash per image, of its uint8 pixels (the pipeline hands them on scaled to [0, 1])."""

    def pixels(x):
        return x if x.dtype == np.uint8 else np.round(x * 255).astype(np.uint8)

    return sorted(
        hashlib.blake2b(pixels(x).tobytes(), digest_size=8).hexdigest()
        for xs, _ in batches
        for x in xs
    )


def test_tfrecords_split_across_workers_by_file_every_record_once_per_epoch(files):
    """Two workers read disjoint files (at most one shared at the boundary), together every
    record once per epoch; each epoch another order; a resume mid-epoch is exact."""
    data = load_data(files["tfr"], global_batch=BATCH, seed=5, workers=2)
    everything = _digests([(files["x"][..., None], None)])
    for epoch in (0, 1):
        shares = [
            _batches(data, start_epoch=epoch, epochs=epoch + 1, worker=w, workers=2) for w in (0, 1)
        ]
        assert all(len(s) == N // BATCH for s in shares)
        assert _digests(shares[0] + shares[1]) == everything
        reading = [data.train.epoch_slices(epoch, w, 2) for w in (0, 1)]
        shared = set(reading[0][:, 0]) & set(reading[1][:, 0])
        assert len(shared) <= 1 and sum(r[:, 2].sum() for r in reading) == N
    steps = N // BATCH
    full = _batches(data, start_epoch=0, epochs=2, worker=1, workers=2)
    assert len(full) == 2 * steps and not _same(full[:steps], full[steps:])  # epochs differ
    assert _same(
        _batches(data, start_epoch=1, epochs=2, skip=7, worker=1, workers=2), full[steps + 7 :]
    )


def test_validation_split_is_seeded_and_exact(files):
    train, val = holdout(2000, 0.1, seed=4)
    assert len(val) == 200 and len(train) == 1800 and not set(train) & set(val)
    assert np.array_equal(val, holdout(2000, 0.1, seed=4)[1])
    assert not np.array_equal(val, holdout(2000, 0.1, seed=5)[1])
    for spec in (files["png"], files["tfr"], files["npz"]):
        data = load_data(spec, global_batch=BATCH, seed=4, validation_split=0.1)
        assert data.train_examples == 1800, spec
        assert (
            sum(len(y) for _, y in data.val)
            if not isinstance(data.val, tuple)
            else len(data.val[1]) == 200
        )


def test_a_changed_file_changes_the_fingerprint(files, tmp_path):
    x, y = files["x"][:100], files["y"][:100]
    paths = write_png_folder(tmp_path / "png", x, y)
    before = load_data(str(tmp_path / "png"), global_batch=10, seed=1).fingerprint
    os.utime(paths[0], ns=(1, 1))
    assert load_data(str(tmp_path / "png"), global_batch=10, seed=1).fingerprint != before


# -- bad input: one DataError line, named -------------------------------------------------


def _class_folders(root, classes=("a", "b")):
    for c in classes:
        (root / c).mkdir(parents=True)
        (root / c / "1.png").write_bytes(png(np.zeros((28, 28), np.uint8)))


@pytest.mark.parametrize(
    "case, needles",
    [
        ("empty folder", ["no class subfolders in"]),
        ("class without images", ["class folder", "/b holds no PNG or JPEG image"]),
        ("one class", ["only one class folder (a)"]),
        ("corrupt first image", ["cannot be decoded as an image"]),
        ("label out of range", ["train label 10 (example 3) is out of range for --num-classes 10"]),
        ("negative label", ["train label -1 (example 0) is negative"]),
        (
            "missing feature",
            [
                "record 0 has no feature 'image/encoded' (it has image/class/label)",
                "--image-feature",
            ],
        ),
        ("negative tfrecord label", ["record 1 has label -2 under image/class/label"]),
        ("npz without y_train", ["it needs x_train and y_train"]),
        ("module raises", ["the function raised RuntimeError: the bucket is not reachable"]),
        ("module returns a string", ["returned str; expected train"]),
        ("module one-hot labels", ["its train split's y has shape (100, 10)", "not one-hot"]),
        ("input shape", ["--input-shape 32,32,1 is not the shape", "--image-size H,W"]),
        ("batch too large", ["global batch 4096 is larger than the 2 training examples"]),
    ],
)
def test_bad_input_is_one_named_data_error(tmp_path, case, needles):
    root = tmp_path / "data"
    kwargs = {}
    if case == "empty folder":
        root.mkdir()
    elif case == "class without images":
        _class_folders(root, ("a",))
        (root / "b").mkdir()
    elif case == "one class":
        _class_folders(root, ("a",))
    elif case == "corrupt first image":
        _class_folders(root)
        (root / "a" / "1.png").write_bytes(b"\x89PNG this is not a png")
    elif case in ("label out of range", "negative label"):
        x, y = mnist(10)
        y[3 if case == "label out of range" else 0] = 10 if case == "label out of range" else -1
        root = tmp_path / "d.npz"
        np.savez(root, x_train=x, y_train=y)
        kwargs = {"num_classes": 10} if case == "label out of range" else {}
    elif case in ("missing feature", "negative tfrecord label"):
        x, y = mnist(4)
        labels = np.array([1, -2, 3, 4]) if case == "negative tfrecord label" else None
        write_tfrecords(
            root,
            x,
            y,
            1,
            image_feature="" if case == "missing feature" else "image/encoded",
            labels=labels,
        )
        root = root / "*.tfrecord"
    elif case == "npz without y_train":
        root = tmp_path / "d.npz"
        np.savez(root, x_train=np.zeros((3, 2)))
    elif case.startswith("module"):
        root = {
            "module raises": "data_fixtures:raising_source",
            "module returns a string": "data_fixtures:wrong_source",
            "module one-hot labels": "data_fixtures:one_hot_source",
        }[case]
    elif case == "input shape":
        _class_folders(root)
        kwargs = {"input_shape": (32, 32, 1)}
    elif case == "batch too large":
        _class_folders(root)
        kwargs = {"global_batch": 4096}
    kwargs.setdefault("global_batch", 2)
    with pytest.raises(DataError) as e:
        load_data(str(root), **kwargs)
    message = str(e.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message


def test_a_glob_that_matches_nothing_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="the pattern matches no file"):
        load_data(str(tmp_path / "*.tfrecord"), global_batch=2)


def test_parameter_server_streams_are_pure_tensorflow(files, tmp_path):
    """sampled() runs on the workers, where the chief's Python does not: no NumPy callback in
    the graph, endless global batches, different per worker."""
    import tensorflow as tf

    sources = {
        "folder": load_data(files["png"], global_batch=BATCH, seed=2),
        "tfrecord": load_data(files["tfr"], global_batch=BATCH, seed=2),
        "tfrecord cached": load_data(files["tfr"], global_batch=BATCH, seed=2, cache=str(tmp_path)),
        "module": load_data("data_fixtures:dataset_source", global_batch=BATCH, seed=2),
    }
    for name, data in sources.items():
        streams = []
        for worker in (0, 1):
            context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=worker)
            ds = data.train.sampled(context)
            graph = ds._as_serialized_graph().numpy()
            assert b"PyFunc" not in graph, name
            streams.append([y.numpy() for _, y in ds.take(N // BATCH + 2)])  # past one pass
        assert all(len(y) == BATCH for y in streams[0]), name
        assert not all(np.array_equal(a, b) for a, b in zip(*streams)), name


def test_seed_0_reads_every_kind_of_source(files):
    """--seed 0 sets TF's global seed to 0; the epoch-seeded shuffles of TFRecords and of a
    function's dataset were then a traceback (symbolic tensor as a Python bool)."""
    from conftest import run_isolated

    out = run_isolated(HERE / "seed0_sources_driver.py", files["tfr"], BATCH)
    assert set(out) == {"tfrecord", "module dataset"} and min(out.values()) > 0


@pytest.mark.parametrize(
    "damage", ["cut mid-record", "cut mid-header", "flipped byte", "length past the end"]
)
def test_a_truncated_or_corrupt_tfrecord_is_one_line_naming_file_and_offset(tmp_path, damage):
    """A file cut mid-record was scanned up to the cut and trained on, exit 0, although the
    scan is documented to read and check every record. Each record is a 12-byte header, its
    bytes and a 4-byte CRC: the 5th one (index 4) is damaged."""
    x, y = mnist(8)
    path = write_tfrecords(tmp_path, x, y, 1)[0]
    raw = path.read_bytes()
    starts, at = [], 0
    while at < len(raw):
        starts.append(at)
        at += 16 + int.from_bytes(raw[at : at + 8], "little")
    start = starts[4]
    if damage == "cut mid-record":
        path.write_bytes(raw[: start + 40])
    elif damage == "cut mid-header":
        path.write_bytes(raw[: start + 5])
    elif damage == "flipped byte":
        path.write_bytes(raw[: start + 30] + bytes([raw[start + 30] ^ 0xFF]) + raw[start + 31 :])
    else:  # a header that claims 1 TiB, with a valid checksum: TensorFlow's reader crashed
        length = (1 << 40).to_bytes(8, "little")  # (SIGSEGV) allocating it
        path.write_bytes(raw[:start] + length + _masked_crc32c(length) + b"x" * 100)
    with pytest.raises(DataError) as e:
        load_data(str(tmp_path / "*.tfrecord"), global_batch=2)
    message = str(e.value)
    assert "\n" not in message
    assert f"{path} is damaged at byte offset {start} (record 4" in message, message
    assert ("checksum" if damage == "flipped byte" else "truncated") in message, message
    if damage == "length past the end":
        assert "its header gives 1099511627776 bytes, 100 are left" in message, message


def _masked_crc32c(data: bytes) -> bytes:
    """The TFRecord format's masked CRC-32C of ``data`` (bitwise; for a few bytes)."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
    crc ^= 0xFFFFFFFF
    return ((((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF).to_bytes(4, "little")


def test_a_gzip_compressed_tfrecord_file_is_named_as_such(tmp_path):
    import gzip

    x, y = mnist(4)
    path = write_tfrecords(tmp_path, x, y, 1)[0]
    path.write_bytes(gzip.compress(path.read_bytes()))
    with pytest.raises(DataError, match="is GZIP-compressed; mirrorfit reads uncompressed"):
        load_data(str(tmp_path / "*.tfrecord"), global_batch=2)


@pytest.mark.parametrize(
    "spec, needle",
    [
        (
            "data_fixtures:exiting_source",
            "the function exited (SystemExit: 0) instead of returning the data",
        ),
        (
            "data_fixtures:exiting_source_with_text",
            "the function exited (SystemExit: no credentials)",
        ),
    ],
)
def test_a_data_function_that_exits_is_a_data_error(spec, needle):
    """SystemExit(0) from a --data function ended `mirrorfit train` with exit 0, no line and
    nothing trained (it is no Exception, so it went past the function's error handling)."""
    with pytest.raises(DataError) as e:
        load_data(spec, global_batch=2)
    assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_on_jax_without_tensorflow_arrays_train_and_files_say_they_need_it(files, monkeypatch):
    """A function's arrays are read with NumPy alone (user.py imported TensorFlow, so a
    JAX-only machine got a traceback); an image folder needs tf.data: one line, not a
    traceback."""
    monkeypatch.setenv("DATA_FIXTURE_N", "256")
    args = ("train", "--backend", "jax", "--epochs", "1", "--no-progress")
    arrays = run_cli(*args, "--data", "data_fixtures:arrays_source", without_tensorflow=True)
    assert arrays.returncode == 0, arrays.stderr[-3000:]
    folder = run_cli(*args, "--data", files["png"], without_tensorflow=True)
    lines = [ln for ln in folder.stderr.splitlines() if ln.strip()]
    assert folder.returncode == 2 and len(lines) == 1, folder.stderr[-3000:]
    assert "tf.data, which needs TensorFlow: pip install" in lines[0], lines[0]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_a_compiled_model_reads_a_functions_examples_and_refuses_a_shrinking_pass(
    backend, monkeypatch
):
    """A compiled --model on a function's dataset of single examples (docs/data.md): batched
    to the global batch (on 2aa0a29, "a batch of the training data has arrays of different
    lengths"); an epoch that then reads fewer batches than the first is one line (Keras's fit
    trains the shorter epoch, unsaid)."""
    monkeypatch.setenv("DATA_FIXTURE_N", "512")
    proc = run_cli(
        *("train", "--backend", backend, "--model", "keras_models:compiled_mlp"),
        *("--epochs", "3", "--no-progress", "--batch-size", "64"),
        *("--data", "data_fixtures:shrinking_later_source"),
    )
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and lines, proc.stderr[-3000:]
    assert "epoch 1/3: accuracy" in proc.stderr  # 8 batches of 64 trained
    # batched here, not the function's own (3c2a390 said "own batches")
    assert "batch: 64 per replica x 1 replicas = 64 global (effective)" in proc.stderr
    assert "warn" not in proc.stderr.lower()  # Keras's on shuffle=True with a dataset
    assert lines[-1] == (
        "mirrorfit: error: the training data ended after 3 batches this pass, 8 in the first: "
        "it must give the same examples on every pass (a Python generator is used up after "
        "one pass; a changing source or a random filter gives other counts); give "
        "steps_per_epoch to read a fixed count of batches each epoch (from a generator that "
        "never ends)"
    ), proc.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize(
    "model,data,steps",
    [
        ("keras_models:compiled_mlp", "batched_dataset_source", 6),  # 384 in batches of 64
        # no keras.Input, drop_remainder: batched again by 3c2a390 (a rank error)
        ("keras_models:compiled_without_input", "drop_batched_source", 6),
    ],
)
def test_a_compiled_model_trains_on_a_functions_own_batches(monkeypatch, model, data, steps):
    """A dataset the --data function batched itself (64) trains in its batches, as Keras's fit
    takes it, whatever --batch-size says; on e3acabe, "a batch of the training data holds 64
    examples, more than batch_size=32"."""
    monkeypatch.setenv("DATA_FIXTURE_N", "512")
    proc = run_cli(
        *("train", "--model", model, "--epochs", "1", "--no-progress"),
        *("--data", f"data_fixtures:{data}"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "batch: the --data dataset's own batches, split over 1 replicas" in proc.stderr
    assert f"done: {steps} steps" in proc.stderr


def test_a_functions_single_number_examples_are_data_and_empty_ones_are_refused():
    """x of shape (N,) from a function trained before the array checks were shared with .npz
    files (which need (N, ...)): kept. A dataset of (0,)-shaped examples was a
    ZeroDivisionError on JAX and a oneDNN abort on TensorFlow."""
    data = load_data("data_fixtures:scalar_examples_source", global_batch=8)
    assert data.input_shape == () and data.train_examples == 64
    with pytest.raises(
        mirrorfit.DataError,
        match=r"yields x of shape \(0,\) and dtype float32; "
        "every example needs one fixed, non-empty",
    ):
        load_data("data_fixtures:empty_examples_dataset_source", global_batch=8)
