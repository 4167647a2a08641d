"""``mirrorfit bench``: which configuration is fastest on *this* machine, and by how much.

grid (the points, each in its own process, alternated and repeated) -> source (the data,
opened once here to check it) -> flops (model FLOPs and the measured matmul peak) -> report
(medians, speedup, efficiency, MFU; table, CSV, JSON, PNG).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import Progress

from mirrorfit.bench.grid import DATA, Grid, run_grid
from mirrorfit.bench.point import Point
from mirrorfit.bench.report import (
    TOLERANCE,
    Row,
    build_rows,
    recommend,
    table_text,
    write_outputs,
)


def check_tolerance(tolerance: float) -> None:
    """MirrorfitError, one line, unless ``tolerance`` is an accuracy difference >= 0."""
    import math

    from mirrorfit.errors import MirrorfitError

    if not math.isfinite(tolerance) or tolerance < 0:
        raise MirrorfitError(
            f"--tolerance must be a finite accuracy difference >= 0, got "
            f"{tolerance}; e.g. --tolerance {TOLERANCE}"
        )


def run_bench(
    grid: Grid,
    *,
    out_dir: str | Path,
    tolerance: float = TOLERANCE,
    show_recommendation: bool = False,
    console: Console | None = None,
) -> dict:
    """Run ``grid``, print the table, write bench.csv/json/png to ``out_dir``; return the meta
    and rows."""
    points = grid.points()  # checks the grid before anything is built
    source, engine = _open_source(grid, points[0])
    # soft_wrap: a message is one line in a log (a long path wrapped at 80 columns split it)
    console = console or Console(stderr=True, soft_wrap=True)
    flops, compiled = _train_flops(grid, source)
    if compiled:  # the user's compile trains it, on both sides
        grid = replace(grid, compiled=True)
        points = grid.points()
    gpus = [d for d in engine.list_devices() if d["type"] == "GPU"]
    devices = _devices(gpus)
    _announce(console, grid, source, len(points), flops)
    peak, runs = _run_points(console, grid, len(points))
    rows = build_rows(runs, peak=peak, train_flops=flops, shared_cores=not gpus)
    meta = _meta(grid, source, devices, flops, peak)
    _print_results(console, rows, peak, shared_cores=not gpus)
    advice = _advice(grid, source, rows, tolerance)
    if show_recommendation:
        print(advice, flush=True)
    paths = write_outputs(rows, Path(out_dir), meta)
    console.print("wrote " + ", ".join(escape(str(p)) for p in paths.values()))
    return {**meta, "rows": rows, "recommendation": advice, "paths": paths}


def _open_source(grid: Grid, first: Point):
    """(``grid``'s data, opened as ``first`` reads it; the grid's first engine, loaded)."""
    from mirrorfit.bench.source import open_source
    from mirrorfit.engine import backends

    # A source that cannot be read fails here, once. MNIST and synthetic data need no
    # framework: checked before one loads (TensorFlow's import alone takes seconds).
    source = open_source(grid, first) if grid.data in DATA else None
    # This process counts the model's FLOPs and opens the data with the grid's first backend
    # (the CLI prepared it); each point runs in its own process on its own.
    engine = backends.load(grid.backends[0])
    return source or open_source(grid, first), engine


def _train_flops(grid: Grid, source) -> tuple[int, bool]:
    """The grid's model's training FLOPs per example on ``source`` (MirrorfitError, one line,
    where the model cannot take its examples), and whether the model comes compiled."""
    from mirrorfit.bench.source import check_model_fits
    from mirrorfit.models.build import model_factory  # after the engine: Keras picks it once

    shape, classes = source.input_shape, source.num_classes
    model = model_factory(grid.model, input_shape=shape, num_classes=classes)()
    check_model_fits(model, source, grid.model)
    if grid.backends[0] == "jax":  # XLA's cost analysis: no TensorFlow needed
        from mirrorfit.bench.jax_point import train_flops_per_example
    else:  # TensorFlow's op statistics
        from mirrorfit.bench.flops import train_flops_per_example
    return train_flops_per_example(model), bool(getattr(model, "compiled", False))


def _devices(gpus: list) -> str:
    """What the points ran on, for the plot's title and the JSON: GPUs, else CPUs."""
    from mirrorfit.distribute._cpu_binding import usable_cpus

    return f"{len(gpus)} GPU(s)" if gpus else f"logical CPU devices on {usable_cpus()} CPU(s)"


def _announce(console: Console, grid: Grid, source, n_points: int, flops: int) -> None:
    """Print (stderr) the data and what the grid will run, before the first point."""
    data = source.label
    if source.description != data:
        console.print(f"data: {escape(source.description)}")  # paths may hold [brackets]
    if not source.has_test and grid.data != "synthetic":
        console.print(
            f"--data {escape(grid.data)} has no test split: no test accuracy (shown "
            "as -), and --recommend compares speed only"
        )
    console.print(
        f"[bold]mirrorfit bench[/] {escape(grid.model)} on {escape(data)}: "
        f"{n_points} points x "
        f"{grid.repeats} repeats, each its own process; {flops / 1e6:,.2f} MFLOP per "
        "training example"
    )
    if grid.compiled:
        console.print(
            f"{escape(grid.model)} is compiled: every point trains it as compiled, through "
            "mirrorfit.fit or (textbook) the model's own fit, on the data as given"
        )


def _run_points(console: Console, grid: Grid, n_points: int) -> tuple[dict, list]:
    """:func:`run_grid` under a progress bar, printing each point's result as it comes."""
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("bench", total=1 + n_points * grid.repeats)

        def on_run(point: Point, result: dict) -> None:
            progress.advance(task)
            if point.kind == "peak":
                return
            console.print(_run_line(point, result))

        peak, runs = run_grid(grid, on_run=on_run)
    return peak, runs


def _run_line(point: Point, result: dict) -> str:
    """One run's progress line: its rate (examples/s) and accuracy, or why it failed."""
    rate = result.get("examples_per_sec")
    acc = result.get("test_accuracy")
    return f"  {point.label:28} " + (
        f"{rate:10,.0f} examples/s" + (f"  acc {acc:.4f}" if acc is not None else "")
        if rate
        else f"FAILED: {escape(str(result.get('error')))}"
    )


def _meta(grid: Grid, source, devices: str, flops: int, peak: dict) -> dict:
    """What bench.json says of the run besides its rows."""
    return {
        "model": grid.model,
        "data": source.label,
        "data_description": source.description,
        "input_shape": list(source.input_shape),
        "num_classes": source.num_classes,
        "devices": devices,
        "repeats": grid.repeats,
        "train_flops_per_example": flops,
        "peak_flops": peak,
    }


def _print_results(console: Console, rows: list[Row], peak: dict, *, shared_cores: bool) -> None:
    """Print the measured peaks and how to read efficiency (stderr), then the table (stdout)."""
    for backend, measured in peak.items():
        console.print(
            f"matmul peak measured in this run ({backend}): "
            + ", ".join(f"{k} {v / 1e9:,.0f} GFLOP/s" for k, v in measured.items())
        )
    if shared_cores:
        console.print(
            "logical CPU devices share the same cores: the ideal speedup is 1.0, so "
            "efficiency = speedup"
        )
    print(table_text(rows), end="", flush=True)  # results on stdout, the rest on stderr


def _advice(grid: Grid, source, rows: list[Row], tolerance: float) -> str:
    """The recommendation line; on data without a test split, by speed only, saying so."""
    if source.has_test or grid.data == "synthetic":
        return recommend(rows, tolerance)
    return recommend(
        rows,
        tolerance,
        no_accuracy=(
            f"--data {grid.data} has no test split: accuracy not compared; check the "
            "precision on data with one"
        ),
    )


__all__ = ["Grid", "Point", "Row", "check_tolerance", "run_bench"]
