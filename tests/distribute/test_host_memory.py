"""Host memory a step frees stays in the process: no page faults to take it back next step.

Each case runs in a fresh Python process (malloc settings are process-wide), without
TensorFlow: the allocation pattern below is what glibc hands back to the OS by default.
"""

import os
import subprocess
import sys
import textwrap

import pytest
from conftest import MNIST_DIR

pytestmark = pytest.mark.skipif(
    not (
        hasattr(os, "confstr")
        and "CS_GNU_LIBC_VERSION" in os.confstr_names
        and os.confstr("CS_GNU_LIBC_VERSION")
    ),
    reason="glibc only",
)

# Buffers of mixed sizes (MiB) allocated and freed by a thread (its own malloc arena), as a
# training step's are. Prints whether the thresholds were set and the page faults per pass.
PROBE = textwrap.dedent("""
    import resource, sys, threading
    import numpy as np
    from mirrorfit.distribute._host_memory import keep_freed_memory
    applied = keep_freed_memory() if sys.argv[1] == "keep" else None
    faults = []
    def passes():
        for i in range(12):
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            buffers = [np.ones(mib << 18, np.float32) for mib in (3, 12, 5, 20, 1, 9)]
            del buffers
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    thread = threading.Thread(target=passes)
    thread.start()
    thread.join()
    print(applied, sorted(faults[2:])[len(faults[2:]) // 2])  # the median pass after warm-up
""")


def _probe(mode: str, **env) -> tuple[str, int]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode],
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
    code = textwrap.dedent("""
        import sys
        from unittest import mock
        from mirrorfit.distribute import _host_memory
        from mirrorfit.engine.tensorflow import devices
        with mock.patch.object(_host_memory, "keep_freed_memory") as keep:
            kwargs = {} if sys.argv[1] == "default" else {"keep_freed_memory": True}
            devices.configure_devices(**kwargs)
            try:  # a refused request changes nothing
                devices.configure_devices(replicas=2, devices=("/cpu:9",), **kwargs)
            except Exception as e:
                print(type(e).__name__)
        print(keep.call_count)
    """)
    for mode, calls in (("default", "0"), ("asked", "1")):
        out = subprocess.run(
            [sys.executable, "-c", code, mode],
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
    code = PROBE.replace(
        'applied = keep_freed_memory() if sys.argv[1] == "keep" else None',
        "from mirrorfit.config import load_config\n"
        "from mirrorfit.job.train import run_training\n"
        "run_training(load_config(model='mlp', epochs=1, train_examples=256, "
        "global_batch_size=64, progress=False))\n"
        "applied = 'ran'",
    )
    assert "run_training" in code
    out = subprocess.run(
        [sys.executable, "-c", code, "train"],
        capture_output=True,
        text=True,
        env={
            **os.environ,
            "CUDA_VISIBLE_DEVICES": "",
            "TF_CPP_MIN_LOG_LEVEL": "3",
            "MIRRORFIT_DATA": str(MNIST_DIR),
        },
        timeout=300,
        check=True,
    ).stdout.split()
    assert out[-2] == "ran" and int(out[-1]) < 200, out[-2:]
