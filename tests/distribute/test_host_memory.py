"""Host memory a step frees stays in the process: no page faults to take it back next step.

Each case runs in a fresh Python process (malloc settings are process-wide), without
TensorFlow: the allocation pattern of memory_probe_driver.py is what glibc hands back to the
OS by default.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import mnist_folder

HERE = Path(__file__).parent

pytestmark = pytest.mark.skipif(
    not (
        hasattr(os, "confstr")
        and "CS_GNU_LIBC_VERSION" in os.confstr_names
        and os.confstr("CS_GNU_LIBC_VERSION")
    ),
    reason="glibc only",
)


def _probe(mode: str, **env) -> tuple[str, int]:
    out = subprocess.run(
        [sys.executable, str(HERE / "memory_probe_driver.py"), mode],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=120,
        check=True,
    ).stdout.split()
    return out[0], int(out[1])


def test_freed_buffers_are_reused_without_page_faults():
    applied, faults = _probe("keep")
    assert applied == "True"
    # 50 MiB of buffers per pass: 12,800 pages if they were handed back and faulted in again.
    assert faults < 200, f"{faults} page faults per pass with freed memory kept"


def test_the_default_would_fault_them_in_again():
    # What the setting is for: glibc's default hands these buffers back every pass. (If a
    # future glibc keeps them by itself, the setting is harmless: say so instead of failing.)
    _, faults = _probe("default")
    if faults < 200:
        pytest.skip(f"this glibc keeps the buffers by default ({faults} faults per pass)")
    assert faults > 1000


@pytest.mark.parametrize(
    "env",
    [
        {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=131072"},
        {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.mmap_threshold=1048576"},
        {"MALLOC_MMAP_THRESHOLD_": "1048576"},
        {"MALLOC_TRIM_THRESHOLD_": "131072"},
    ],
)
def test_a_users_own_thresholds_are_left_alone(env):
    applied, _ = _probe("keep", **env)
    assert applied == "False"


def test_other_malloc_tunables_do_not_turn_it_off():
    applied, faults = _probe("keep", GLIBC_TUNABLES="glibc.malloc.arena_max=2")
    assert applied == "True" and faults < 200


def test_configure_devices_keeps_freed_memory_only_when_asked():
    # Off for a library caller (a notebook's memory is not ours to keep); train and bench ask.
    for mode, calls in (("default", "0"), ("asked", "1")):
        out = subprocess.run(
            [sys.executable, str(HERE / "configure_devices_driver.py"), mode],
            capture_output=True,
            text=True,
            env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
            timeout=120,
            check=True,
        ).stdout.split()
        assert out[-2:] == ["ConfigError", calls]


def test_mirrorfit_train_keeps_freed_memory():
    # A training run asks for it (its every step needs the memory again): after a tiny run, the
    # probe's buffers are reused in this process without page faults.
    out = subprocess.run(
        [sys.executable, str(HERE / "memory_probe_driver.py"), "train"],
        capture_output=True,
        text=True,
        env={
            **os.environ,
            "CUDA_VISIBLE_DEVICES": "",
            "TF_CPP_MIN_LOG_LEVEL": "3",
            "MIRRORFIT_DATA": str(mnist_folder()),
        },
        timeout=300,
        check=True,
    ).stdout.split()
    assert out[-2] == "ran" and int(out[-1]) < 200, out[-2:]
