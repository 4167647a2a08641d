"""output_paths: where a run writes, checked before any work. Legitimate places pass and leave
nothing behind; every bad one is one ConfigError line naming the flag, the value and the fix
(never an OSError or RuntimeError from deep in pathlib)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mirrorfit.errors import ConfigError
from mirrorfit.artifacts.output_paths import check_output_file, check_output_folder

from conftest import permissions_apply

HERE = Path(__file__).parent


@pytest.fixture
def place(tmp_path, monkeypatch):
    """A folder with a file, a link to nothing, a loop of links, a link to a real folder and a
    checkpoint folder from an earlier run; the tests work in it (relative paths)."""
    (tmp_path / "f.txt").write_text("x")
    (tmp_path / "ckpt" / "ckpt-000010").mkdir(parents=True)
    (tmp_path / "runs" / "a").mkdir(parents=True)
    (tmp_path / "runs" / "a" / "events.out.tfevents.1").write_text("")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere" / "x")
    (tmp_path / "loop").symlink_to("loop")
    (tmp_path / "cklink").symlink_to(tmp_path / "ckpt")
    (tmp_path / "mlink").symlink_to("f.txt")
    (tmp_path / "with space").mkdir()
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _entries(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize(
    "path", ["ckpt", "./ckpt/", "cklink", ".", "new/deep/er", "runs/a", "runs/b"]
)
def test_folders_a_run_may_use_pass_and_nothing_is_made(place, path):
    before = _entries(place)
    check_output_folder("--checkpoint-dir", path)
    assert _entries(place) == before  # no folder made, no probe file left


@pytest.mark.parametrize(
    "path",
    ["m.json", "runs/m.json", "f.txt", "cklink/m.json", "~backup.json", "with space/../m é.json"],
)
def test_files_a_run_may_write_pass(place, path):
    before = _entries(place)
    check_output_file("--metrics-out", path)
    assert _entries(place) == before


@pytest.mark.parametrize(
    "check, path, words",
    [
        ("folder", "f.txt", "--logdir f.txt is a file; give a folder like runs/NAME"),
        ("folder", "f.txt/sub/deeper", "--logdir f.txt/sub/deeper: f.txt is a file, not a folder"),
        ("folder", "dangling", "--logdir dangling: dangling is a link to nothing"),
        ("folder", "dangling/sub", "--logdir dangling/sub: dangling is a link to nothing"),
        ("folder", "loop", "--logdir loop: a loop of symbolic links on the way to loop"),
        (
            "folder",
            "loop/sub",
            "--logdir loop/sub: a loop of symbolic links on the way to loop/sub",
        ),
        ("folder", "x/" + "a" * 300 + "/y", "is over 255 bytes; give a shorter path"),
        ("folder", "/".join(["abcdefgh"] * 600), "the path is over 4096 bytes"),
        ("folder", "a\0b", "contains a NUL character"),
        ("file", "ckpt", "--logdir ckpt is a folder; pass a file path"),
        ("file", "f.txt/m.json", "--logdir f.txt/m.json: f.txt is a file, not a folder"),
        ("file", "f.txt/x/m.json", "--logdir f.txt/x/m.json: f.txt is a file, not a folder"),
        (
            "file",
            "nope/m.json",
            "--logdir nope/m.json: folder nope does not exist; create it first",
        ),
        ("file", "dangling/m.json", "dangling is a link to nothing"),
        ("file", "loop/m.json", "a loop of symbolic links on the way to loop/m.json"),
        ("file", "a" * 300 + ".json", "is over 255 bytes"),
        # the write goes through a longer temporary name first: it must fit too
        ("file", "k" * 240 + ".keras", "the file name is over 191 bytes"),
        (
            "file",
            "mlink",
            "--logdir mlink is a symbolic link (f.txt); the file is replaced, not written through",
        ),
        ("folder", "~/runs", "--logdir ~/runs: ~ is not expanded here; write the full path"),
    ],
)
def test_bad_places_are_one_line_naming_the_flag_and_the_fix(place, check, path, words):
    before = _entries(place)
    fn = check_output_folder if check == "folder" else check_output_file
    with pytest.raises(ConfigError, match=re.escape(words)):
        fn("--logdir", path)
    assert _entries(place) == before


@pytest.mark.skipif(not Path("/dev/null").exists(), reason="needs /dev/null")
def test_a_device_is_not_replaced_by_a_file():
    # Written atomically (temp file + rename), /dev/null would become a JSON file as root.
    with pytest.raises(ConfigError, match="--metrics-out /dev/null is not a regular file"):
        check_output_file("--metrics-out", "/dev/null")


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_a_place_no_one_may_create_files_in_is_refused():
    with pytest.raises(ConfigError, match=re.escape("--export-dir /proc/m: cannot write in /proc")):
        check_output_folder("--export-dir", "/proc/m")


def test_a_folder_this_user_may_write_but_not_read_is_refused(tmp_path):
    """Written files are renamed in and the folder fsynced, which opens it for reading: a
    write-only folder passed the write test and failed after training."""
    box = tmp_path / "box"
    box.mkdir()
    box.chmod(0o333)
    try:
        assert _refusal("check_output_file", "--metrics-out", box / "m.json") == (
            f"--metrics-out {box}/m.json: cannot read {box} (Permission denied), which writing "
            "there safely needs (fsync); choose a place this user may read and write"
        )
        assert "which writing there safely needs" in _refusal(
            "check_output_folder", "--checkpoint-dir", box
        )
        # A folder the run creates in it is its own; nothing reads or fsyncs the parent
        assert _refusal("check_output_folder", "--checkpoint-dir", box / "ckpt") is None
        assert _refusal("check_output_folder", "--logdir", box) is None  # TensorBoard writes
    finally:
        box.chmod(0o700)


def test_another_user_s_file_in_a_sticky_folder_is_refused(tmp_path):
    """/tmp is sticky: only a file's or the folder's owner may rename over the file, so
    another user's metrics.json there cannot be replaced (it passed, and failed at the end)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to give a file to another user")
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    os.chown(sticky, 65534, 65534)  # like /tmp: owned by someone else than this user
    theirs, mine = sticky / "m.json", sticky / "mine.json"
    theirs.write_text("{}")
    os.chown(theirs, 65534, 65534)
    mine.write_text("{}")
    assert _refusal("check_output_file", "--metrics-out", mine) is None  # one's own file
    assert _refusal("check_output_file", "--metrics-out", theirs) == (
        f"--metrics-out {theirs} belongs to another user (uid 65534) in a folder where only its "
        f"owner may replace it ({sticky} is sticky, like /tmp); pass another file name"
    )
    if _cap_eff() & (1 << 3):
        check_output_file("--metrics-out", theirs)  # root, with CAP_FOWNER, may replace it


def test_a_removed_current_folder_is_one_line(tmp_path, monkeypatch):
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    with pytest.raises(ConfigError, match="the current folder no longer exists"):
        check_output_folder("--logdir", "runs")
    check_output_file("--metrics-out", tmp_path / "m.json")  # an absolute path still works


def test_a_folder_this_user_may_not_enter_is_one_line(tmp_path):
    locked = tmp_path / "locked"
    (locked / "inner").mkdir(parents=True)
    locked.chmod(0)
    try:
        assert re.search(
            "cannot reach .*locked/inner.*Permission denied",
            _refusal("check_output_folder", "--logdir", locked / "inner" / "runs"),
        )
        assert "Permission denied" in _refusal(
            "check_output_file", "--metrics-out", locked / "inner" / "m.json"
        )
    finally:
        locked.chmod(0o700)


def _refusal(check: str, flag: str, path: Path) -> str | None:
    """output_paths.``check``(flag, path)'s ConfigError message (None: accepted), for a user
    whom permissions apply to: in a process of its own, without root's powers over them."""
    proc = subprocess.run(
        [
            *permissions_apply(),
            sys.executable,
            str(HERE / "output_check_driver.py"),
            check,
            flag,
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip() or None


def _cap_eff() -> int:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            return int(next(ln for ln in f if ln.startswith("CapEff:")).split()[1], 16)
    except (OSError, StopIteration):
        return 0
