"""data.mnist: find mnist.npz (flag, $MIRRORFIT_DATA, Keras cache, download), split it, and
reject missing or malformed files with a clear DataError."""

import functools
import hashlib
import http.server
import os
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT, permissions_apply
from mirrorfit.data import mnist
from mirrorfit.data.mnist import load_mnist, locate_mnist
from mirrorfit.errors import DataError

HERE = Path(__file__).parent

# A proxy on a closed local port: any download attempt fails at once, network or not.
NO_NETWORK = {"https_proxy": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9"}


def test_real_mnist_splits_as_in_the_chapter(mnist_dir):
    s = load_mnist(str(mnist_dir), download=False)
    assert s.x_val.shape == (5000, 28, 28) and s.x_train.shape == (55000, 28, 28)
    assert s.x_test.shape == (10000, 28, 28) and s.x_train.dtype == np.uint8
    with np.load(mnist_dir / "mnist.npz") as f:  # validation = the first 5,000 images
        np.testing.assert_array_equal(s.x_val, f["x_train"][:5000])
        np.testing.assert_array_equal(s.y_train[:10], f["y_train"][5000:5010])


def test_train_examples_takes_the_first_n(mnist_dir):
    s = load_mnist(str(mnist_dir), train_examples=1000, download=False)
    assert len(s.x_train) == 1000 and len(s.x_val) == 5000


def test_train_examples_too_many(mnist_dir):
    with pytest.raises(DataError, match="--train-examples 60000 is more than the 55000"):
        load_mnist(str(mnist_dir), train_examples=60000, download=False)


def test_env_var_then_keras_cache_order(tmp_path, monkeypatch, mnist_dir):
    monkeypatch.setenv("MIRRORFIT_DATA", str(mnist_dir))
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras"))
    assert locate_mnist(download=False) == mnist_dir / "mnist.npz"
    monkeypatch.delenv("MIRRORFIT_DATA")
    cache = tmp_path / "keras" / "datasets"
    cache.mkdir(parents=True)
    (cache / "mnist.npz").write_bytes((mnist_dir / "mnist.npz").read_bytes())
    assert locate_mnist(download=False) == cache / "mnist.npz"


def test_nothing_found_lists_what_was_tried(tmp_path, monkeypatch):
    monkeypatch.delenv("MIRRORFIT_DATA", raising=False)
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    with pytest.raises(
        DataError,
        match=r"MNIST not found; tried \$MIRRORFIT_DATA \(unset\), "
        r"Keras cache .* --data-dir",
    ):
        locate_mnist(download=False)


def test_no_network_fails_fast_naming_every_place(tmp_path, monkeypatch):
    monkeypatch.setenv("MIRRORFIT_DATA", str(tmp_path / "nowhere"))
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras"))
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    for key, value in NO_NETWORK.items():
        monkeypatch.setenv(key, value)
    start = time.perf_counter()
    with pytest.raises(DataError) as info:
        locate_mnist()
    assert time.perf_counter() - start < 10
    message = str(info.value)
    assert "\n" not in message
    for place in (
        f"$MIRRORFIT_DATA ({tmp_path / 'nowhere' / 'mnist.npz'}: no such file)",
        f"Keras cache ({tmp_path / 'keras' / 'datasets' / 'mnist.npz'}: no such file)",
        f"download from {mnist.URL} (URLError",
    ):
        assert place in message, message
    assert not list((tmp_path / "keras" / "datasets").iterdir())  # no partial file left


@pytest.fixture
def served(tmp_path, mnist_dir):
    """A local HTTP server holding the real mnist.npz (a stand-in for the Keras download)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "mnist.npz").symlink_to(mnist_dir / "mnist.npz")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/mnist.npz"
    server.shutdown()


def test_download_goes_to_the_keras_cache_and_is_checked(tmp_path, monkeypatch, mnist_dir, served):
    monkeypatch.delenv("MIRRORFIT_DATA", raising=False)
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras"))
    monkeypatch.setattr(mnist, "URL", served)
    monkeypatch.setattr(mnist, "SHA256", "0" * 64)  # not this file's hash: refused
    with pytest.raises(DataError, match="download from .* is not MNIST's"):
        locate_mnist()
    cache = tmp_path / "keras" / "datasets"
    assert not list(cache.iterdir())  # nothing half-written or unverified left behind
    real = hashlib.sha256((mnist_dir / "mnist.npz").read_bytes()).hexdigest()
    monkeypatch.setattr(mnist, "SHA256", real)
    assert locate_mnist() == cache / "mnist.npz"
    assert [p.name for p in cache.iterdir()] == ["mnist.npz"]
    assert hashlib.sha256((cache / "mnist.npz").read_bytes()).hexdigest() == real


def test_wrong_data_dir_is_an_error_not_a_fallback(tmp_path):
    with pytest.raises(DataError, match=f"no mnist.npz at --data-dir {tmp_path}"):
        locate_mnist(str(tmp_path), download=False)


def test_a_path_that_cannot_be_looked_at_is_named_with_why(tmp_path, monkeypatch):
    long = tmp_path / ("x" * 300)  # longer than a file name may be
    with pytest.raises(
        DataError,
        match=r"--data-dir .*x{300}: cannot read .*x{300} \(file "
        r"name too long\); point it",
    ):
        locate_mnist(str(long), download=False)
    monkeypatch.setenv("MIRRORFIT_DATA", str(long))
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    with pytest.raises(
        DataError,
        match=r"tried \$MIRRORFIT_DATA \(.*x{300}: file name too "
        r"long\), Keras cache \(.*: no such file\)",
    ):
        locate_mnist(download=False)


def test_data_dir_is_a_folder_holding_mnist_npz_or_the_file_whatever_its_name(tmp_path, mnist_dir):
    real = mnist_dir / "mnist.npz"
    (tmp_path / "x.npz").mkdir()  # a folder, though named like a file
    (tmp_path / "x.npz" / "mnist.npz").symlink_to(real)
    assert locate_mnist(str(tmp_path / "x.npz"), download=False) == tmp_path / "x.npz/mnist.npz"
    for given in (tmp_path / "x.npz", os.fsencode(tmp_path / "x.npz")):  # a Path, bytes
        assert locate_mnist(given, download=False) == tmp_path / "x.npz/mnist.npz"
    (tmp_path / "MNIST.NPZ.bak").symlink_to(real)
    assert locate_mnist(str(tmp_path / "MNIST.NPZ.bak"), download=False).name == "MNIST.NPZ.bak"
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "mnist.npz").mkdir()
    with pytest.raises(
        DataError,
        match=r"cannot read .*empty/mnist.npz \(a folder, not a "
        r"file\)",
    ):
        locate_mnist(str(tmp_path / "empty"), download=False)
    os.mkfifo(tmp_path / "fifo")  # reading it would wait forever
    with pytest.raises(DataError, match=r"cannot read .*fifo \(not a regular file\)"):
        locate_mnist(str(tmp_path / "fifo"), download=False)
    with pytest.raises(
        DataError,
        match=r"no mnist.npz at --data-dir ~/data \(~ is not "
        r"expanded here: write the full path\)",
    ):
        locate_mnist("~/data", download=False)


def test_a_file_this_user_may_not_read_is_named_and_the_search_goes_on(tmp_path):
    (tmp_path / "locked").mkdir()
    (tmp_path / "locked" / "mnist.npz").write_bytes(b"PK")
    (tmp_path / "locked" / "mnist.npz").chmod(0)
    (tmp_path / "keras").mkdir()
    (tmp_path / "keras" / "datasets").write_text("a file where a folder goes")
    env = dict(
        os.environ, MIRRORFIT_DATA=str(tmp_path / "locked"), KERAS_HOME=str(tmp_path / "keras")
    )
    proc = subprocess.run(
        [
            *permissions_apply(),
            sys.executable,
            str(HERE / "locate_mnist_driver.py"),
            str(tmp_path / "locked"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    explicit, search = proc.stdout.splitlines()
    assert explicit == (
        f"--data-dir {tmp_path}/locked: cannot read {tmp_path}/locked/mnist.npz "
        "(permission denied); make it readable by this user, or point "
        "--data-dir at a copy that is"
    ), proc.stderr
    assert (
        f"tried $MIRRORFIT_DATA ({tmp_path}/locked/mnist.npz: permission denied), Keras "
        f"cache ({tmp_path}/keras/datasets: not a folder)"
    ) in search


def test_a_link_to_nothing_and_an_empty_variable_are_named(tmp_path, monkeypatch):
    (tmp_path / "gone").symlink_to(tmp_path / "nothing")
    with pytest.raises(DataError, match=r"cannot read .*gone/mnist.npz \(a link to nothing\)"):
        locate_mnist(str(tmp_path / "gone"), download=False)
    monkeypatch.setenv("MIRRORFIT_DATA", "")
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    with pytest.raises(DataError, match=r"tried \$MIRRORFIT_DATA \(empty\)"):
        locate_mnist(download=False)


def test_corrupt_file(tmp_path):
    (tmp_path / "mnist.npz").write_bytes(b"not a zip at all")
    with pytest.raises(DataError, match="is not a valid MNIST npz file"):
        load_mnist(str(tmp_path), download=False)


def test_an_encrypted_member_is_a_damaged_file_not_a_traceback(tmp_path):
    _fake_mnist(tmp_path / "mnist.npz")
    raw = bytearray((tmp_path / "mnist.npz").read_bytes())
    at = raw.find(b"PK\x01\x02")  # the first member's central directory entry
    raw[at + 8] |= 1  # its "encrypted" flag: zipfile asks for a password (RuntimeError)
    (tmp_path / "mnist.npz").write_bytes(bytes(raw))
    with pytest.raises(
        DataError,
        match=r"is not a valid MNIST npz file \(RuntimeError: .*"
        r"password required.*replace it with that file",
    ):
        load_mnist(str(tmp_path), download=False)


def test_wrong_layout(tmp_path):
    np.savez(
        tmp_path / "mnist.npz",
        x_train=np.zeros((10, 32, 32), np.uint8),
        y_train=np.zeros(10),
        x_test=np.zeros((2, 28, 28)),
        y_test=np.zeros(2),
    )
    with pytest.raises(DataError, match=r"x_train has shape \(10, 32, 32\)"):
        load_mnist(str(tmp_path), download=False)


def test_missing_key(tmp_path):
    np.savez(tmp_path / "mnist.npz", x_train=np.zeros((10, 28, 28), np.uint8))
    with pytest.raises(DataError, match="is not a valid MNIST npz file"):
        load_mnist(str(tmp_path), download=False)


def _fake_mnist(path, n_train=12, n_test=4, **override):
    arrays = {
        "x_train": np.zeros((n_train, 28, 28), np.uint8),
        "y_train": np.arange(n_train, dtype=np.uint8) % 10,
        "x_test": np.zeros((n_test, 28, 28), np.uint8),
        "y_test": np.arange(n_test, dtype=np.uint8) % 10,
    }
    np.savez(path, **{**arrays, **override})


def test_a_well_formed_small_file_loads(tmp_path):
    _fake_mnist(tmp_path / "mnist.npz")  # the checks below reject only what is wrong
    s = load_mnist(str(tmp_path), download=False)
    assert len(s.y_test) == 4 and s.y_val.dtype == np.int32


@pytest.mark.parametrize(
    "override,match",
    [
        ({"y_test": np.zeros(3, np.uint8)}, "x_test has 4 images but y_test has 3 labels"),
        ({"x_train": np.zeros((11, 28, 28), np.uint8)}, "x_train has 11 images but y_train has 12"),
        ({"y_train": np.full(12, 10, np.uint8)}, r"y_train\[0\] is 10, not a class 0-9 \(12 such"),
        ({"y_test": np.array([0, 1, -1, 3], np.int8)}, r"y_test\[2\] is -1, not a class 0-9"),
        ({"y_test": np.zeros(4, np.float32)}, "y_test has dtype float32; expected integer labels"),
        ({"x_test": np.zeros((4, 28, 28), np.float32)}, "x_test has dtype float32; expected uint8"),
        ({"y_train": np.int64(3)}, r"y_train has shape \(\)"),
    ],
)
def test_inconsistent_contents_are_refused_at_load(tmp_path, override, match):
    _fake_mnist(tmp_path / "mnist.npz", **override)
    with pytest.raises(DataError, match=match):
        load_mnist(str(tmp_path), download=False)


def _declaring(path, key, shape, dtype="|u1"):
    """A valid small npz but for ``key``, whose header declares ``shape`` over 16 bytes."""
    _fake_mnist(path)
    header = {"descr": dtype, "fortran_order": False, "shape": shape}
    with zipfile.ZipFile(path) as z:
        members = {n: z.read(n) for n in z.namelist()}
    import io

    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(out, header)
    members[f"{key}.npy"] = out.getvalue() + b"\0" * 16
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)


@pytest.mark.parametrize(
    "key,shape,dtype,match",
    [
        # 1 KB declaring 730 GiB: NumPy allocated it before reading (a traceback, or worse, memory)
        (
            "x_train",
            (10**9, 28, 28),
            "|u1",
            r"x_train declares shape \(1000000000, 28, 28\) "
            r"\(784,000,000,000 bytes\) but holds only 16",
        ),
        ("y_test", (10**18,), "<i8", "y_test declares shape"),
        ("x_test", (4, 32, 32), "|u1", r"x_test has shape \(4, 32, 32\), expected"),
        ("y_train", (12,), "|O", r"y_train holds Python objects \(dtype object\)"),
    ],
)
def test_a_header_is_checked_before_anything_is_allocated(tmp_path, key, shape, dtype, match):
    _declaring(tmp_path / "mnist.npz", key, shape, dtype)
    with pytest.raises(DataError, match=match):
        load_mnist(str(tmp_path), download=False)


def test_arrays_past_the_memory_bound_are_refused_unread(tmp_path, monkeypatch):
    _fake_mnist(tmp_path / "mnist.npz")
    monkeypatch.setattr(mnist, "MAX_BYTES", 1000)  # the 12 + 4 tiny images take 12,560 bytes
    with pytest.raises(DataError, match=r"would take 0.0 GiB in memory, more than"):
        load_mnist(str(tmp_path), download=False)
    monkeypatch.setattr(mnist, "MAX_BYTES", 4 << 30)

    def no_memory(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(np, "load", no_memory)
    with pytest.raises(DataError, match="not enough memory to load its arrays"):
        load_mnist(str(tmp_path), download=False)


def test_corrupt_compressed_member(tmp_path):
    """A damaged deflate stream raises zlib.error inside NumPy: one DataError instead."""
    path = tmp_path / "mnist.npz"
    rng = np.random.default_rng(0)
    np.savez_compressed(
        path,
        x_train=rng.integers(0, 50, (40, 28, 28), dtype=np.uint8),
        y_train=np.zeros(40, np.uint8),
        x_test=np.zeros((4, 28, 28), np.uint8),
        y_test=np.zeros(4, np.uint8),
    )
    with zipfile.ZipFile(path) as z:
        info = z.getinfo("x_train.npy")
    data = bytearray(path.read_bytes())
    middle = (
        info.header_offset + 30 + len(info.filename) + len(info.extra) + info.compress_size // 3
    )
    data[middle : middle + 64] = b"\xff" * 64
    path.write_bytes(bytes(data))
    with pytest.raises(DataError, match="is not a valid MNIST npz file \\(error: Error -3"):
        load_mnist(str(tmp_path), download=False)


def _cli_without_data_env(home, *args):
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("MIRRORFIT_DATA", "KERAS_HOME", "no_proxy", "NO_PROXY")
    }
    env.update(NO_NETWORK, HOME=str(home), TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run(
        [sys.executable, "-m", "mirrorfit.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=ROOT,
    )


def test_plain_train_finds_mnist_in_the_keras_cache(tmp_path, mnist_dir):
    """`mirrorfit train` with no flag and no $MIRRORFIT_DATA: ~/.keras/datasets/mnist.npz."""
    cache = tmp_path / ".keras" / "datasets"
    cache.mkdir(parents=True)
    (cache / "mnist.npz").symlink_to(mnist_dir / "mnist.npz")
    proc = _cli_without_data_env(
        tmp_path, "train", "--train-examples", "256", "--epochs", "1", "--batch-size", "64"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # rich folds long lines (and paths) when stderr is not a terminal
    assert f"mlpon{cache / 'mnist.npz'}" in "".join(proc.stderr.split()), proc.stderr[-3000:]


def test_plain_train_without_data_is_one_line(tmp_path):
    out = tmp_path / "m.json"
    proc = _cli_without_data_env(tmp_path, "train", "--metrics-out", str(out))
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("mirrorfit: error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for place in (
        "$MIRRORFIT_DATA (unset)",
        f"Keras cache ({tmp_path}/.keras/datasets",
        "download from https://",
        "--data-dir DIR",
    ):
        assert place in errors[0], errors[0]
    assert not out.exists()
