"""``mirrorfit launch`` with tiny Python tasks (no TensorFlow): layout and TF_CONFIG, prefixed
output, the chief's exit code, restarts, signals, and that no process outlives the launcher."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from mirrorfit.distribute import launch
from mirrorfit.distribute._cpu_binding import (
    available_cores,
    describe,
    parse_cpu_list,
    plan_cpus,
    started_on,
    threads_note,
    usable_cpus,
)
from mirrorfit.distribute._output import _READ_BYTES, MAX_LINE, stream_lines
from mirrorfit.distribute.cluster import Cluster

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).parent


@pytest.fixture
def task(tmp_path):
    """argv prefix for the task script (launch_task_driver.py); files land in tmp_path."""
    script = HERE / "launch_task_driver.py"
    return lambda mode, *extra: [sys.executable, str(script), mode, str(tmp_path), *extra]


def run(argv, capsys):
    code = launch.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def configs(out):
    """The TF_CONFIG each task life printed: a list of (task, cluster, restart)."""
    found = re.findall(r"TF_CONFIG (\{.*\}) RESTART (\d+)", out)
    return [(json.loads(c)["task"], json.loads(c)["cluster"], int(r)) for c, r in found]


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"  # a zombie left for a non-reaping init is dead


def test_plan_cluster_layouts():
    mw = launch.plan_cluster(2, 0, [1001, 1002])
    assert [c.task_name() for c in mw] == ["worker 0", "worker 1"] and mw[0].is_chief
    assert mw[1] == Cluster(
        workers=("127.0.0.1:1001", "127.0.0.1:1002"), task_index=1, source="launch"
    )
    ps = launch.plan_cluster(2, 1, [1, 2, 3, 4])
    assert [c.task_name() for c in ps] == ["chief", "worker 0", "worker 1", "ps 0"]
    assert ps[0].tf_config()["cluster"] == {
        "chief": ["127.0.0.1:1"],
        "ps": ["127.0.0.1:4"],
        "worker": ["127.0.0.1:2", "127.0.0.1:3"],
    }
    assert len(set(launch.free_ports(5))) == 5


def test_cpu_plans_split_whole_cores_evenly_or_not_at_all():
    assert plan_cpus([(0,), (1,)], 2) == [(0,), (1,)]
    assert plan_cpus([(c,) for c in range(5)], 2) == [(0, 1, 2), (3, 4)]
    # hyperthread siblings (0 and 8, ...) stay on one worker: 2 workers, 4 cores each
    cores = [(c, c + 8) for c in range(8)]
    assert plan_cpus(cores, 2) == [(0, 1, 2, 3, 8, 9, 10, 11), (4, 5, 6, 7, 12, 13, 14, 15)]
    assert plan_cpus([(2,), (4,), (6,)], 3) == [(2,), (4,), (6,)]  # the CPUs allowed
    assert plan_cpus([(0, 1)], 2) is None  # one core, two workers: not bound
    assert parse_cpu_list("0-3,8\n") == {0, 1, 2, 3, 8} and parse_cpu_list("5") == {5}
    assert (describe((3,)), describe((0, 1, 2, 3)), describe((0, 2, 4))) == (
        "cpu 3",
        "cpus 0-3",
        "cpus 0,2,4",
    )


def _task_cpus(text: str) -> dict[str, list[int]]:
    found = re.findall(r"\[(\w+(?: \d+)?)\] CPUS (\[.*\])", text)
    return {name: json.loads(cpus) for name, cpus in found}


def _mine() -> list[int]:
    return sorted(os.sched_getaffinity(0))


@pytest.mark.skipif(len(available_cores() or ()) < 2, reason="needs 2 cores to bind 2 workers")
def test_each_worker_runs_on_cores_of_its_own(task, capsys):
    mine, cores = _mine(), available_cores()
    code, out, err = run(["--workers", "2", "--", *task("cpus")], capsys)
    assert code == 0, err
    cpus = _task_cpus(out)
    assert sorted(cpus["worker 0"] + cpus["worker 1"]) == mine  # disjoint, all of them
    half = len(cores) - len(cores) // 2
    assert cpus["worker 0"] == sorted(c for core in cores[:half] for c in core)
    assert "worker 0 127.0.0.1:" in err and f"({describe(cpus['worker 1'])})" in err
    assert _mine() == mine  # the launcher itself is not left bound


@pytest.mark.skipif(available_cores() is None, reason="no CPU affinity on this OS")
@pytest.mark.parametrize(
    "argv", [["--workers", "2", "--bind-cpus", "none"], ["--workers", "1", "--ps", "1"]]
)
def test_workers_are_not_bound_when_asked_or_with_ps(argv, task, capsys):
    code, out, err = run([*argv, "--", *task("cpus")], capsys)
    assert code == 0, err
    cpus = _task_cpus(out)  # with --ps, some workers may be stopped before they print
    assert "chief" in cpus if "--ps" in argv else len(cpus) == 2
    assert all(c == _mine() for c in cpus.values()) and "(cpu" not in err


@pytest.mark.skipif(available_cores() is None, reason="no CPU affinity on this OS")
def test_the_launchers_own_cpus_come_back_even_when_a_start_fails(capsys, tmp_path):
    mine = _mine()
    with pytest.raises(OSError):
        with started_on([mine[-1]]) as bound:
            assert bound and _mine() == [mine[-1]]
            subprocess.Popen(["/no/such/program"])
    assert _mine() == mine
    # through the launcher: an executable whose interpreter is missing cannot start (one
    # line, exit 2) and leaves nothing bound
    script = tmp_path / "bad.sh"
    script.write_text("#!/no/such/interpreter\n")
    script.chmod(0o755)
    code, _, err = run(["--workers", "2", "--", str(script)], capsys)
    assert code == 2 and "cannot start" in err and _mine() == mine


@pytest.mark.skipif(available_cores() is None, reason="no CPU affinity on this OS")
def test_a_bound_process_counts_its_own_cpus_and_names_threads_beyond_them():
    mine = _mine()
    assert usable_cpus() == len(mine)  # not os.cpu_count(): a cpuset or taskset narrows it
    assert threads_note(None) is None and threads_note(len(mine)) is None
    with started_on([mine[-1]]):  # as a launched worker with one core of its own
        assert usable_cpus() == 1 and threads_note(1) is None
        note = threads_note(3)
    assert note == (
        "--threads-per-worker 3 is more than the 1 CPU(s) this process may run "
        "on: its threads will take turns on them; --threads-per-worker 1 fits"
    )


@pytest.mark.skipif(available_cores() is None, reason="no CPU affinity on this OS")
def test_a_launcher_on_one_core_does_not_bind_and_says_why(task):
    last = _mine()[-1]  # a mask that need not start at CPU 0
    with started_on([last]):
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "mirrorfit.distribute.launch",
                "--workers",
                "2",
                "--",
                *task("cpus"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert proc.returncode == 0, proc.stderr
    assert _task_cpus(proc.stdout) == {"worker 0": [last], "worker 1": [last]}
    assert "not binding workers to CPUs: 2 workers, 1 core(s)" in proc.stderr


def test_output_is_prefixed_per_task_and_stream(task, capsys):
    code, out, err = run(["--workers", "2", "--", *task("output")], capsys)
    assert code == 0
    seen = configs(out)
    assert sorted((t["type"], t["index"]) for t, _, _ in seen) == [("worker", 0), ("worker", 1)]
    cluster = seen[0][1]
    assert all(c == cluster for _, c, _ in seen)  # one cluster, each task its own index
    ports = [a.rsplit(":", 1)[1] for a in cluster["worker"]]
    assert len(set(ports)) == 2 and all(a.startswith("127.0.0.1:") for a in cluster["worker"])
    for i in (0, 1):
        # "\r" redraws: the first is shown, the next within REDRAW_INTERVAL_S dropped; the line
        # that ends with "\r\n" is the final state
        assert f"[worker {i}] step 1/3\n[worker {i}] step 3/3\n" in out
        assert "step 2/3" not in out
        assert f"[worker {i}] to stderr from worker{i}\n" in err
    assert "starting 2 task(s)" in err


def _stream(*chunks: bytes) -> str:
    """What stream_lines writes for ``chunks`` written to a pipe (each a separate write)."""
    r, w = os.pipe()

    def feed():  # from a thread: more than the pipe's buffer (64 KiB) blocks until read
        for chunk in chunks:
            os.write(w, chunk)
        os.close(w)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    lines: list[str] = []
    stream_lines(os.fdopen(r, "rb", buffering=0), "[w] ", lines.append)
    feeder.join(10)
    return "".join(lines)


def test_carriage_returns_never_garble_lines():
    # "\r\n" split across two reads; the redraw "b" comes within REDRAW_INTERVAL_S of "a"
    assert (
        _stream(b"a\rb\rc\r", b"\nd\n", b"x" * 10 + b"\r")
        == "[w] a\n[w] c\n[w] d\n[w] xxxxxxxxxx\n"
    )


def test_overlong_lines_come_in_pieces_and_bad_utf8_is_replaced():
    """A task writing megabytes without a line end is printed in pieces of at most MAX_LINE
    bytes plus one read, as it comes: not held in memory until a line end that may never come."""
    long = 3 * MAX_LINE + 10
    r, w = os.pipe()
    first_piece = threading.Event()
    shown_before_line_end: list[bool] = []

    def feed():  # from a thread: a write past the pipe's buffer blocks until it is read
        os.write(w, b"y" * long)
        # A generous wait, which only a regression spends: with pieces it returns at once.
        shown_before_line_end.append(first_piece.wait(5))
        os.write(w, b"\xff ok\n")
        os.close(w)

    lines: list[str] = []

    def write(line: str) -> None:
        lines.append(line)
        first_piece.set()

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    stream_lines(os.fdopen(r, "rb", buffering=0), "[w] ", write)
    feeder.join(10)
    assert shown_before_line_end == [True]
    assert len(lines) >= 2 and all(ln.startswith("[w] ") and ln.endswith("\n") for ln in lines)
    # a piece is the buffer once it passed MAX_LINE, or what was left (at most MAX_LINE) and
    # the read that brought the line end: never more than one read past MAX_LINE
    assert max(len(ln) - len("[w] \n") for ln in lines) <= MAX_LINE + _READ_BYTES < long
    assert "".join(ln[len("[w] ") : -1] for ln in lines) == "y" * long + "\ufffd ok"


def test_group_restarts_on_fresh_ports_after_a_worker_dies(task, capsys):
    code, out, err = run(
        ["--workers", "2", "--max-restarts", "2", "--grace-s", "2", "--", *task("group-restart")],
        capsys,
    )
    assert code == 0, err
    assert (
        "mirrorfit launch: worker 1 exited with SIGKILL (-9); restarting all 2 task(s) "
        "(restart 1 of 2)"
    ) in err
    assert err.count("starting 2 task(s)") == 2
    first = {c["worker"][0] for t, c, r in configs(out) if r == 0}
    second = {c["worker"][0] for t, c, r in configs(out) if r == 1}
    assert first and second and first != second


def test_exhausted_restarts_return_the_failing_code(task, capsys):
    start = time.monotonic()
    code, out, err = run(
        [
            "--workers",
            "2",
            "--max-restarts",
            "1",
            "--grace-s",
            "2",
            "--",
            *task("always-fail", "4"),
        ],
        capsys,
    )
    assert code == 4
    assert "worker 1 exited with code 4; restarting all 2 task(s) (restart 1 of 1)" in err
    assert (
        "worker 1 exited with code 4; no restarts left (--max-restarts 1); stopping all 2 "
        "task(s); exit code 4"
    ) in err
    assert time.monotonic() - start < 10  # the sleeping chief was stopped, not waited for


@pytest.mark.parametrize("rc,why", [(2, "a usage error"), (65, "a diverged run")])
def test_usage_errors_and_diverged_runs_are_not_retried(task, capsys, rc, why):
    code, out, err = run(
        ["--workers", "2", "--max-restarts", "3", "--", *task("always-fail", str(rc))], capsys
    )
    assert code == rc and err.count("starting 2 task(s)") == 1
    assert f"worker 1 exited with code {rc} ({why}, which a restart would repeat)" in err


def test_a_usage_error_seen_with_its_peers_lost_contact_decides_the_exit_code():
    """Both workers of a group refusing a flag: the chief exited 2, worker 1 then lost it (69);
    seen in the same look, the 69 was handled first and restarted the group (issue 49)."""
    ended = [(69, False), (2, True)]  # (exit code, chief) in the order the poll found them
    ended.sort(key=lambda t: launch._handling_order(*t))
    assert ended[0] == (2, True)
    assert sorted([(0, True), (2, False)], key=lambda t: launch._handling_order(*t))[0][0] == 0
    assert sorted([(1, True), (1, False)], key=lambda t: launch._handling_order(*t))[0] == (
        1,
        False,
    )


def test_a_usage_error_after_its_peers_lost_contact_is_still_2_and_not_restarted(task, capsys):
    code, out, err = run(
        ["--workers", "2", "--max-restarts", "2", "--", *task("refused-late")], capsys
    )
    assert code == 2 and err.count("starting 2 task(s)") == 1, err
    assert "worker 0 exited with code 2 (a usage error, which a restart would repeat)" in err


def test_parameter_server_layout_and_the_chiefs_exit_code(task, capsys):
    start = time.monotonic()
    code, out, err = run(["--workers", "2", "--ps", "1", "--", *task("ps")], capsys)
    assert code == 5  # the chief's, although workers and ps never end by themselves
    tasks = sorted((t["type"], t["index"]) for t, _, _ in configs(out))
    assert tasks == [("chief", 0), ("ps", 0), ("worker", 0), ("worker", 1)]
    cluster = configs(out)[0][1]
    assert sorted(cluster) == ["chief", "ps", "worker"] and len(cluster["worker"]) == 2
    assert "chief exited with code 5" in err
    assert time.monotonic() - start < 8


def test_parameter_server_worker_restarts_alone_at_its_address(task, capsys):
    code, out, err = run(
        ["--workers", "2", "--ps", "1", "--max-restarts", "1", "--", *task("ps-worker-restart")],
        capsys,
    )
    assert code == 0, err
    assert err.count("starting 4 task(s)") == 1
    assert re.search(
        r"worker 1 exited with SIGKILL \(-9\); restarting worker 1 alone at "
        r"127\.0\.0\.1:\d+ \(restart 1 of 1\)",
        err,
    )
    lives = [(c, r) for t, c, r in configs(out) if t == {"type": "worker", "index": 1}]
    assert len(lives) == 2 and lives[0][0] == lives[1][0]  # the same TF_CONFIG both times


def test_sigterm_is_forwarded_and_nothing_outlives_the_launcher(task, tmp_path):
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mirrorfit.distribute.launch",
            "--workers",
            "2",
            "--grace-s",
            "1",
            "--",
            *task("sigterm"),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 15
        while not all((tmp_path / f).exists() for f in ("worker0.ready", "worker1.ready")):
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
            time.sleep(0.02)
        pids = [
            int((tmp_path / f).read_text())
            for f in ("worker0.pid", "worker1.pid", "grandchild.pid")
        ]
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 75, err  # the chief's code after its SIGTERM handler
    assert "[worker 0] chief got SIGTERM" in out
    assert "SIGTERM: forwarding it to 2 running task(s)" in err
    assert time.monotonic() - start < 5  # grace 1 s, then SIGKILL for the one ignoring it
    time.sleep(0.1)
    assert [p for p in pids if alive(p)] == []


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--workers", "0", "--", "true"], "--workers must be >= 1, got 0"),
        (["--workers", "1", "--ps", "-1", "--", "true"], "--ps must be >= 0, got -1"),
        (["--workers", "1", "--max-restarts", "-2", "--", "true"], "--max-restarts must be >= 0"),
        (["--workers", "1", "--grace-s", "nan", "--", "true"], "--grace-s must be"),
        (["--workers", "1"], "needs the command to run after --"),
        (["--workers", "1", "--"], "needs the command to run after --"),
        (
            ["--workers", "1", "--", "no-such-program-xyz"],
            "'no-such-program-xyz' after -- is not on PATH",
        ),
        (
            ["--workers", "1", "--", "./no/such/file"],
            "'./no/such/file' after -- is not an executable file",
        ),
        (["--workers", "300", "--", "true"], "at most 256 tasks on one host"),
    ],
)
def test_bad_flags_exit_2_with_one_line_before_anything_starts(argv, words, capsys):
    code, out, err = run(argv, capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and words in err and "Traceback" not in err


def test_a_launch_inside_a_launched_task_is_refused(capsys, monkeypatch):
    monkeypatch.setenv("MIRRORFIT_LAUNCH", "1")  # what every task gets
    code, out, err = run(["--workers", "2", "--", "true"], capsys)
    assert code == 2 and "nested launchers" in err and err.count("\n") == 1


def test_malformed_numbers_are_argparse_usage_errors(capsys):
    with pytest.raises(SystemExit) as info:
        launch.main(["--workers", "two", "--", "true"])
    assert info.value.code == 2 and "--workers" in capsys.readouterr().err


def test_mirrorfit_runs_from_the_launchers_own_environment():
    assert launch.resolve_command(["mirrorfit", "train", "--epochs", "1"]) == [
        sys.executable,
        "-m",
        "mirrorfit",
        "train",
        "--epochs",
        "1",
    ]
    assert launch.resolve_command(["true"]) == ["true"]
    help_text = subprocess.run(
        [sys.executable, "-m", "mirrorfit", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "usage: mirrorfit" in help_text


def test_registered_as_mirrorfit_launch(task, capsys):
    """Through the real CLI (the lead registers add_launch_parser / run_launch in mirrorfit.cli)."""
    from mirrorfit import cli

    code = cli.main(["launch", "--workers", "1", "--", *task("output")])
    out, err = capsys.readouterr()
    assert code == 0 and "[worker 0] to stderr from worker0" in err
    assert cli.main(["launch", "--workers", "0", "--", "true"]) == 2
    assert "--workers must be >= 1" in capsys.readouterr().err


def test_far_more_tasks_than_cpus_is_refused_unless_oversubscribed(monkeypatch, capsys):
    """`--workers 256` on 2 cores started 256 TensorFlow processes (load 93 for 7 minutes).
    Up to 2 tasks per CPU (at least 4) start, so 2 workers, or 2 workers + ps + chief, run on
    2 CPUs; more needs --oversubscribe."""
    monkeypatch.setattr(launch, "usable_cpus", lambda: 2)
    code, _, err = run(["--workers", "5", "--", "true"], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert "--workers 5 --ps 0 makes 5 tasks for the 2 CPU(s) this launcher may use" in err
    assert "--oversubscribe" in err
    code, _, err = run(["--workers", "2", "--ps", "1", "--", "true"], capsys)  # 4 tasks
    assert code == 0, err
    code, _, err = run(["--workers", "5", "--oversubscribe", "--", "true"], capsys)
    assert code == 0, err


def test_sigterm_ends_a_large_launch_within_the_grace_period(tmp_path):
    """SIGTERM took 444 s to end a launch of 256 tasks: after the SIGKILLs, each task's output
    got 2 s to drain, one after the other (and 0.5 s more each on the way out). Here 12 tasks
    ignore SIGTERM and leave a process in a session of their own holding their output open
    (out of reach of the group kill): still over in grace + a few seconds."""
    script = HERE / "hold_output_driver.py"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mirrorfit.distribute.launch",
            "--workers",
            "12",
            "--oversubscribe",
            "--bind-cpus",
            "none",
            "--grace-s",
            "1",
            "--",
            sys.executable,
            str(script),
            str(tmp_path),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("*.held"))) < 12:
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
        took = time.monotonic() - start
    finally:
        if proc.poll() is None:
            proc.kill()
        for held in tmp_path.glob("*.held"):
            try:
                os.kill(int(held.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert "SIGTERM: forwarding it to 12 running task(s)" in err, err
    assert took < 1 + 4, (took, err[-2000:])
