"""Turn bench runs into rows (medians, spread, speedup, efficiency, MFU), a table, CSV, JSON, a
PNG plot, and a recommendation."""

from __future__ import annotations

import csv
import io
import statistics
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from mirrorfit import _io
from mirrorfit.bench.point import Point
from mirrorfit.models.precision import COMPUTE_DTYPES

# The recommendation's default accuracy tolerance (against float32), and results folder.
TOLERANCE = 0.005
RESULTS = "bench-results"
# A point whose runs spread (max - min) by more than this fraction of the median is flagged.
WIDE_SPREAD = 0.10


@dataclass(frozen=True)
class Row:
    """One configuration's medians over its runs. Rates in examples/s, times in ms."""

    label: str
    kind: str
    replicas: int
    precision: str
    xla: bool
    accum_steps: int
    steps_per_execution: int
    global_batch: int
    runs: int
    examples_per_sec: float | None
    min_examples_per_sec: float | None
    max_examples_per_sec: float | None
    spread: float | None  # (max - min) / median
    step_time_ms: float | None
    speedup_vs_1: float | None
    scaling_efficiency: float | None
    mfu: float | None
    test_accuracy: float | None
    vs_textbook: float | None
    note: str = ""
    backend: str = "tensorflow"


def build_rows(
    runs: list[tuple[Point, list[dict]]],
    *,
    peak: dict[str, float],
    train_flops: int,
    shared_cores: bool,
) -> list[Row]:
    """Aggregate each point's runs. Scaling efficiency = speedup / ideal speedup, where the ideal
    is N on N independent devices and 1 on logical devices sharing one CPU's cores."""
    stats = {p: _stats(results) for p, results in runs}
    return [_row(point, stats, peak, train_flops, shared_cores) for point, _ in runs]


def _row(point: Point, stats: dict, peak: dict, train_flops: int, shared_cores: bool) -> Row:
    """``point``'s row: its runs' median rate (examples/s), its ratios to its 1-replica and
    textbook twins and to the matmul peak, and notes on failures, noise and overlaps."""
    s = stats[point]
    notes = [s["error"]] if s["error"] else []
    book = None if point.kind == "textbook" else _textbook_twin(stats, point)
    rate = s["median"]
    speedup = _speedup(point, s, stats, notes)
    ideal = 1 if shared_cores else point.replicas
    dtype = COMPUTE_DTYPES[point.precision]
    if s["spread"] is not None and s["spread"] > WIDE_SPREAD:
        notes.append(f"noisy: runs spread {s['spread']:.0%}")
    return Row(
        **_config_columns(point),
        runs=s["runs"],
        examples_per_sec=rate,
        min_examples_per_sec=s["min"],
        max_examples_per_sec=s["max"],
        spread=s["spread"],
        step_time_ms=1e3 * point.global_batch / rate if rate else None,
        speedup_vs_1=speedup,
        scaling_efficiency=speedup / ideal if speedup else None,
        mfu=train_flops * rate / peak[point.backend][dtype] if rate else None,
        test_accuracy=s["accuracy"],
        # last: its "overlaps" note follows the others
        vs_textbook=_ratio(s, book, notes, "vs the textbook") if book else None,
        note="; ".join(notes),
    )


def _config_columns(point: Point) -> dict:
    """The row's columns that say which configuration it measured."""
    return {
        "label": point.label,
        "kind": point.kind,
        "replicas": point.replicas,
        "precision": point.precision,
        "xla": point.xla,
        "accum_steps": point.accum_steps,
        "steps_per_execution": point.steps_per_execution,
        "global_batch": point.global_batch,
        "backend": point.backend,
    }


def _textbook_twin(stats: dict, point: Point) -> dict | None:
    """The stats of the float32 textbook point at ``point``'s replicas and backend, if run."""
    return next(
        (
            stats[p]
            for p in stats
            if p.kind == "textbook"
            and p.replicas == point.replicas
            and p.precision == "fp32"
            and p.backend == point.backend
        ),
        None,
    )


def _speedup(point: Point, s: dict, stats: dict, notes: list[str]) -> float | None:
    """Median rate over the same point's on 1 replica: 1.0 at 1 replica, None without rates."""
    if point.replicas > 1:
        return _ratio(s, _find(stats, point, replicas=1), notes, "vs 1 replica")
    return 1.0 if s["median"] else None


def _stats(results: list[dict]) -> dict:
    ok = [r for r in results if "error" not in r]
    rates = [r["examples_per_sec"] for r in ok]
    errors = sorted({r["error"] for r in results if "error" in r})
    if not rates:
        return {
            "runs": 0,
            "median": None,
            "min": None,
            "max": None,
            "spread": None,
            "accuracy": None,
            "error": "failed: " + "; ".join(errors),
        }
    median = statistics.median(rates)
    accuracies = [r["test_accuracy"] for r in ok if r.get("test_accuracy") is not None]
    return {
        "runs": len(rates),
        "median": median,
        "min": min(rates),
        "max": max(rates),
        # no steps timed (a point's data shorter than its batch) measure 0: no spread
        "spread": (max(rates) - min(rates)) / median if median > 0 else None,
        # None on synthetic data: random labels, nothing to learn or test
        "accuracy": statistics.median(accuracies) if accuracies else None,
        "error": f"{len(errors)} run(s) failed: {errors[0]}" if errors else "",
    }


def _find(stats: dict, point: Point, **changes) -> dict | None:
    return stats.get(replace(point, **changes))


def _ratio(a: dict, b: dict | None, notes: list[str], what: str) -> float | None:
    if not b or not a["median"] or not b["median"]:
        return None
    if a["runs"] > 1 and b["runs"] > 1 and a["min"] <= b["max"] and b["min"] <= a["max"]:
        notes.append(f"overlaps {what}")
    return a["median"] / b["median"]


_SYNTHETIC = "synthetic data: accuracy not compared; check the precision on real data"


def recommend(rows: list[Row], tolerance: float, *, no_accuracy: str = _SYNTHETIC) -> str:
    """The fastest mirrorfit configuration whose test accuracy is within ``tolerance`` of the
    float32 points' (median) accuracy; when no row has a test accuracy, the fastest, with
    ``no_accuracy`` (why, and what to do) in brackets."""
    ours = [r for r in rows if r.kind == "mirrorfit" and r.examples_per_sec]
    if ours and all(r.test_accuracy is None for r in ours):  # synthetic data, or no test split
        best = max(ours, key=lambda r: r.examples_per_sec)
        return f"recommended: {best.label}: {best.examples_per_sec:,.0f} examples/s ({no_accuracy})"
    fp32 = [r.test_accuracy for r in ours if r.precision == "fp32" and r.test_accuracy is not None]
    if not fp32:
        return "no recommendation: the grid has no float32 point to compare accuracy with"
    reference = statistics.median(fp32)
    good = [
        r for r in ours if r.test_accuracy is not None and r.test_accuracy >= reference - tolerance
    ]
    best = max(good, key=lambda r: r.examples_per_sec)
    return (
        f"recommended: {best.label}: {best.examples_per_sec:,.0f} examples/s, test accuracy "
        f"{best.test_accuracy:.4f} (float32 {reference:.4f}, tolerance {tolerance})"
    )


def table_text(rows: list[Row]) -> str:
    """The rows as a fixed-width table."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=None)
    for col in (
        "config",
        "ex/s (median)",
        "range",
        "step ms",
        "speedup",
        "eff.",
        "MFU",
        "test acc",
        "vs textbook",
        "note",
    ):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(
            r.label,
            _f(r.examples_per_sec, ",.0f"),
            f"{_f(r.min_examples_per_sec, ',.0f')}-{_f(r.max_examples_per_sec, ',.0f')}",
            _f(r.step_time_ms, ".2f"),
            _f(r.speedup_vs_1, ".2f", "x"),
            _f(r.scaling_efficiency, ".0%"),
            _f(r.mfu, ".0%"),
            _f(r.test_accuracy, ".4f"),
            _f(r.vs_textbook, ".2f", "x"),
            r.note,
        )
    out = io.StringIO()
    Console(file=out, width=200, force_terminal=False).print(table)
    return out.getvalue() + (
        f"noisy: a point's runs spread more than {WIDE_SPREAD:.0%} of its median; overlaps: the "
        "two points' ranges of runs overlap, so their ratio is too close to call on this "
        "machine\n"
    )


def _f(value, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def write_outputs(rows: list[Row], out_dir: Path, meta: dict) -> dict[str, Path]:
    """bench.csv, bench.json and bench.png in ``out_dir``, each written atomically."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        "csv": out_dir / "bench.csv",
        "json": out_dir / "bench.json",
        "png": out_dir / "bench.png",
    }
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(asdict(rows[0])))
    writer.writeheader()
    writer.writerows(asdict(r) for r in rows)
    _io.write_bytes_atomic(paths["csv"], buf.getvalue().encode())
    _io.write_json_atomic(paths["json"], {**meta, "rows": [asdict(r) for r in rows]})
    _io.write_bytes_atomic(paths["png"], _plot(rows, meta))
    return paths


def _plot(rows: list[Row], meta: dict) -> bytes:
    import matplotlib

    matplotlib.use("Agg")  # no display here
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    series: dict[str, list[Row]] = {}
    backends = len({r.backend for r in rows}) > 1
    for r in rows:
        name = (
            f"textbook fit{'' if r.precision == 'fp32' else ' ' + r.precision}"
            if r.kind == "textbook"
            else None
        ) or " ".join(
            [r.precision]
            + (["xla"] * r.xla)
            + ([f"accum{r.accum_steps}"] * (r.accum_steps > 1))
            + ([f"spe{r.steps_per_execution}"] * (len({x.steps_per_execution for x in rows}) > 1))
        )
        series.setdefault(f"{r.backend} {name}" if backends else name, []).append(r)
    for name, group in series.items():
        group = sorted((r for r in group if r.examples_per_sec), key=lambda r: r.replicas)
        style = dict(linestyle="--") if "textbook" in name else {}
        xs = [r.replicas for r in group]
        left.plot(xs, [r.examples_per_sec for r in group], marker="o", label=name, **style)
        right.plot(xs, [r.scaling_efficiency for r in group], marker="o", label=name, **style)
    replicas = sorted({r.replicas for r in rows})
    for ax, title, ylabel in (
        (left, "Throughput", "examples/s (median)"),
        (right, "Scaling efficiency", "speedup / ideal speedup"),
    ):
        ax.set_title(title)
        ax.set_xlabel("replicas")
        ax.set_ylabel(ylabel)
        ax.set_xticks(replicas)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    right.set_ylim(bottom=0)
    fig.suptitle(f"mirrorfit bench: {meta.get('model', '')} on {meta.get('devices', '')}")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


__all__ = ["Row", "build_rows", "recommend", "table_text", "write_outputs"]
