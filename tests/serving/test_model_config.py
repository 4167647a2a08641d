"""serving.model_config: TF Serving's config files (models, batching, monitoring) and their
errors."""

import pytest

from mirrorfit.errors import ConfigError
from mirrorfit.serving.model_config import (
    VersionPolicy,
    read_batching_parameters,
    read_model_config_file,
    read_monitoring_config,
)


def test_model_config_file_with_policies_and_labels(tmp_path, monkeypatch):
    (tmp_path / "conf").mkdir()
    monkeypatch.chdir(tmp_path)
    cfg = tmp_path / "conf" / "models.config"
    cfg.write_text("""
model_config_list {
  config { name: 'm1' base_path: '/models/m1' model_platform: 'tensorflow'
           model_version_policy { specific { versions: 42 versions: 43 } }
           version_labels { key: 'stable' value: 42 } version_labels { key: 'canary' value: 43 } }
  config { name: 'm2' base_path: 'relative/m2' model_version_policy { latest { num_versions: 2 } } }
  config { name: 'm3' base_path: '/models/m3' model_version_policy { all {} } }
}""")
    m1, m2, m3 = read_model_config_file(str(cfg))
    assert m1.policy == VersionPolicy(kind="specific", versions=(42, 43))
    assert m1.labels == {"stable": 42, "canary": 43}
    # TF Serving's rule: relative to the working directory (was: to the config file's folder)
    assert m2.base_path == str(tmp_path / "relative" / "m2")
    assert m2.policy.select([1, 2, 3]) == [2, 3]
    assert m3.policy.select([3, 1]) == [1, 3]
    assert m1.policy.select([41, 42, 44]) == [42]


@pytest.mark.parametrize(
    "text, needle",
    [
        ("model_config_list { config { name: 'a' } }", "needs a name and a base_path"),
        ("model_config_list { config { nam: 'a' } }", "not valid text format"),
        (
            "model_config_list { config { name: 'a' base_path: '/x' } config { name: 'a' "
            "base_path: '/y' } }",
            "listed twice",
        ),
        (
            "model_config_list { config { name: 'a' base_path: '/x' model_platform: 'pytorch' } }",
            "model_platform 'pytorch' is not supported",
        ),
    ],
)
def test_bad_model_config_files_name_the_problem(tmp_path, text, needle):
    cfg = tmp_path / "bad.config"
    cfg.write_text(text)
    with pytest.raises(ConfigError, match=needle):
        read_model_config_file(str(cfg))


def test_batching_parameters_file(tmp_path):
    path = tmp_path / "batching.config"
    path.write_text(
        "max_batch_size { value: 128 } batch_timeout_micros { value: 500 }\n"
        "max_enqueued_batches { value: 1000000 } num_batch_threads { value: 8 }\n"
        "allowed_batch_sizes: 32 allowed_batch_sizes: 128\n"
    )
    p = read_batching_parameters(str(path), cpus=2)
    assert (
        p.max_batch_size,
        p.batch_timeout_micros,
        p.max_enqueued_batches,
        p.num_batch_threads,
        p.allowed_batch_sizes,
    ) == (128, 500, 1000000, 8, (32, 128))
    assert read_batching_parameters(None, cpus=3).num_batch_threads == 3  # TF Serving default


@pytest.mark.parametrize(
    "text, needle",
    [
        (
            "max_batch_size { value: 64 } allowed_batch_sizes: 8 allowed_batch_sizes: 32",
            "Last entry in allowed_batch_sizes must match max_batch_size; last entry was 32; "
            "expected 64",
        ),
        ("max_batch_sise { value: 64 }", "not valid text format"),
        ("max_batch_size { value: 0 }", "max_batch_size must be >= 1"),
        # each thread is started up front
        (
            "num_batch_threads { value: 100000 }",
            "num_batch_threads must be at most 1024, got 100000",
        ),
    ],
)
def test_bad_batching_files(tmp_path, text, needle):
    path = tmp_path / "b.config"
    path.write_text(text)
    with pytest.raises(ConfigError, match=needle):
        read_batching_parameters(str(path), cpus=2)


def test_monitoring_config(tmp_path):
    path = tmp_path / "m.config"
    path.write_text('prometheus_config { enable: true, path: "/metrics/here" }')
    assert read_monitoring_config(str(path)) == "/metrics/here"
    path.write_text("prometheus_config { enable: true }")
    assert read_monitoring_config(str(path)) == "/monitoring/prometheus/metrics"
    path.write_text("prometheus_config { enable: false }")
    assert read_monitoring_config(str(path)) is None


@pytest.mark.parametrize(
    "read",
    [
        read_model_config_file,
        read_monitoring_config,
        lambda path: read_batching_parameters(path, cpus=2),
    ],
)
def test_a_binary_config_file_is_not_valid_text_format(tmp_path, read):
    path = tmp_path / "binary.config"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00")  # was a UnicodeDecodeError traceback
    with pytest.raises(ConfigError, match="not valid text format: byte 0 is not UTF-8"):
        read(str(path))
