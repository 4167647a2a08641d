"""bench.report: medians, speedup, efficiency, MFU, noise flags, recommendation, outputs."""

import csv
import json

import matplotlib.image
import numpy as np
import pytest

from mirrorfit.bench.point import Point
from mirrorfit.bench.report import build_rows, recommend, table_text, write_outputs

PEAK = {"tensorflow": {"float32": 100e9, "bfloat16": 200e9, "float16": 50e9}}


def _runs(*rates, acc=0.9):
    return [{"examples_per_sec": r, "test_accuracy": acc} for r in rates]


def _grid():
    one = Point(kind="mirrorfit", replicas=1, global_batch=100)
    return [
        (one, _runs(1000, 1010, 990)),
        (Point(kind="mirrorfit", replicas=2, global_batch=100), _runs(980, 985, 990)),
        (
            Point(kind="mirrorfit", replicas=1, precision="bf16", global_batch=100),
            _runs(1800, 1700, 1900, acc=0.895),
        ),
        (
            Point(kind="mirrorfit", replicas=2, precision="fp16", global_batch=100),
            _runs(400, 900, 500, acc=0.5),
        ),
        (Point(kind="textbook", replicas=1, global_batch=100), _runs(700, 720, 710)),
        (Point(kind="textbook", replicas=2, global_batch=100), [{"error": "boom"}]),
    ]


def test_rows_aggregate_medians_and_ratios():
    rows = build_rows(_grid(), peak=PEAK, train_flops=10_000_000, shared_cores=True)
    fp32_1, fp32_2, bf16_1, fp16_2, book_1, book_2 = rows
    assert fp32_1.examples_per_sec == 1000 and fp32_1.runs == 3
    assert fp32_1.step_time_ms == pytest.approx(100.0)  # 100 examples at 1000/s
    assert fp32_2.speedup_vs_1 == pytest.approx(0.985)
    assert fp32_2.scaling_efficiency == pytest.approx(0.985)  # shared cores: ideal speedup 1
    assert fp32_1.mfu == pytest.approx(1e7 * 1000 / 100e9)
    assert bf16_1.mfu == pytest.approx(1e7 * 1800 / 200e9)  # against the bf16 peak
    assert fp32_1.vs_textbook == pytest.approx(1000 / 710)
    assert "noisy" in fp16_2.note  # 400-900 around 500
    assert book_2.examples_per_sec is None and "failed: boom" in book_2.note
    assert "overlaps" not in fp32_1.note


def test_efficiency_on_independent_devices_divides_by_the_replicas():
    rows = build_rows(_grid()[:2], peak=PEAK, train_flops=1, shared_cores=False)
    assert rows[1].scaling_efficiency == pytest.approx(0.985 / 2)


def test_overlapping_ranges_are_flagged():
    grid = [
        (Point(kind="mirrorfit", replicas=1), _runs(100, 110, 120)),
        (Point(kind="mirrorfit", replicas=2), _runs(105, 115, 125)),
    ]
    rows = build_rows(grid, peak=PEAK, train_flops=1, shared_cores=True)
    assert "overlaps vs 1 replica" in rows[1].note


def test_a_point_that_timed_no_steps_is_a_row_not_a_division_by_zero():
    grid = [
        (Point(kind="mirrorfit", replicas=1), _runs(100, 110)),
        (Point(kind="mirrorfit", replicas=2), _runs(0, 0)),
    ]
    rows = build_rows(grid, peak=PEAK, train_flops=1, shared_cores=True)
    assert rows[1].examples_per_sec == 0 and rows[1].spread is None
    assert rows[1].speedup_vs_1 is None and rows[1].mfu is None


def test_recommend_takes_the_fastest_within_tolerance():
    rows = build_rows(_grid(), peak=PEAK, train_flops=1, shared_cores=True)
    assert recommend(rows, 0.01).startswith("recommended: x1 bf16 spe50")
    assert recommend(rows, 0.001).startswith("recommended: x1 fp32 spe50")


def test_outputs_table_csv_json_png(tmp_path):
    rows = build_rows(_grid(), peak=PEAK, train_flops=1, shared_cores=True)
    text = table_text(rows)
    assert "x2 fp16 spe50" in text and "textbook fit x1" in text and "MFU" in text
    paths = write_outputs(rows, tmp_path, {"model": "cnn", "devices": "test"})
    with open(paths["csv"]) as f:
        table = list(csv.DictReader(f))
    assert [r["label"] for r in table] == [r.label for r in rows]
    assert float(table[0]["examples_per_sec"]) == 1000
    data = json.loads(paths["json"].read_text())
    assert data["model"] == "cnn" and len(data["rows"]) == 6
    image = matplotlib.image.imread(paths["png"])
    assert image.shape[0] > 300 and image.shape[1] > 800
    assert np.std(image) > 0.05  # lines and text, not a blank canvas
    assert not list(tmp_path.glob(".*.tmp"))  # no temp files left behind
