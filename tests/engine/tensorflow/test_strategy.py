"""devices + strategy: logical CPU splits, strategy choice by name, clear errors."""

from pathlib import Path

from conftest import run_isolated

HERE = Path(__file__).parent


# Logical CPU devices are what a host without GPUs offers; CUDA_VISIBLE_DEVICES="" makes a GPU
# host one of those, so this holds on both (cpu_strategies_driver.py).
def test_logical_cpu_devices_and_strategies():
    out = run_isolated(HERE / "cpu_strategies_driver.py")
    assert out["devices"] == ["/cpu:0", "/cpu:1"] and out["shared"]
    assert "sharing the same" in out["describe"]
    assert out["auto"] == ["MirroredStrategy", 2] and out["mirrored"] == ["MirroredStrategy", 2]
    assert out["central-storage"] == ["CentralStorageStrategy", 2]
    assert out["auto_ops"] == "ReductionToOneDevice"  # measured faster than RING on CPUs
    assert out["single"] == "OneDeviceStrategy"
    assert "only be configured before TensorFlow starts" in out["relayout"]


def test_default_setup_is_what_tensorflow_reports():
    """No flags: every GPU TensorFlow lists, else the one CPU (on whatever host runs this)."""
    out = run_isolated(HERE / "default_setup_driver.py")
    if out["gpus"]:
        assert out["kind"] == "GPU" and not out["shared"]
        assert out["devices"] == [f"/gpu:{i}" for i in range(out["gpus"])]
    else:
        assert out["kind"] == "CPU" and out["shared"] and out["devices"] == ["/cpu:0"]
    assert out["replicas"] == out["logical"] == len(out["devices"])
    assert out["strategy"] == ("OneDeviceStrategy" if out["replicas"] == 1 else "MirroredStrategy")


def test_host_replicas_are_fed_plain_batches_cut_in_the_step():
    """Replicas on this host's CPUs take the plain dataset; the step cuts each batch into
    contiguous pieces, one per replica: every row exactly once, the same pieces as TF's
    distributed dataset for full batches, fewer rows (none twice) for a partial one."""
    out = run_isolated(HERE / "host_feed_driver.py")
    assert out["mirrored"] is True and out["central-storage"] is False
    assert out["plain"]
    assert out["pieces"] == [
        [[0, 1, 2, 3], [4, 5, 6, 7]],
        [[8, 9, 10, 11], [12, 13, 14, 15]],
        [[16, 17], [18, 19]],
    ]
    assert out["theirs"] == out["pieces"][0]
    assert out["through"] == [4, 4]  # not cut again
    assert out["sparse_plain"] is False
