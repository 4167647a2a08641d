"""What ``--profile`` reports: a step's time by part, the devices' utilisation, and a one-line
diagnosis; fitting/profile.py fills it (through the fit runner, on both engines)."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class ProfileReport:
    """Seconds per optimizer step by part, and device utilisation in % (None if unknown)."""

    step_s: float
    input_wait_s: float
    compute_s: float
    all_reduce_s: float
    update_overhead_s: float
    input_batch_s: float  # the pipeline alone, per global batch
    cpu_percent: float | None
    gpu_percent: float | None
    precision: str = "fp32"
    xla: bool = False
    input_source: str = "memory"  # how the input is read: "memory", "image files, ..."

    def fractions(self) -> dict[str, float]:
        # The parts are timed again after training, against the run's own steady step: under
        # load they can add up to more than that step (docs/benchmarks.md#figures-behind-the-code).
        parts = self.input_wait_s + self.compute_s + self.all_reduce_s + self.update_overhead_s
        total = max(self.step_s, parts, 1e-12)
        return {
            "input_wait": self.input_wait_s / total,
            "compute": self.compute_s / total,
            "all_reduce": self.all_reduce_s / total,
            "update_overhead": self.update_overhead_s / total,
        }

    def diagnosis(self) -> str:
        """One line: what bounds the step, and what to try."""
        f = self.fractions()
        if f["input_wait"] > 0.2:
            if "decoded every step" in self.input_source:
                fix = (
                    "--cache memory (or --cache DIR) to decode each image once, or more "
                    "CPU cores for the decoding"
                )
            else:
                fix = "more CPU cores for the input pipeline, or more steps per execution"
            return (
                f"input bound: {f['input_wait']:.0%} of step time waiting for data "
                f"({self.input_source}); try {fix}"
            )
        if f["all_reduce"] > 0.3:
            return (
                f"communication bound: {f['all_reduce']:.0%} of step time in the all-reduce; "
                "try a larger per-replica batch, --accum-steps, or fewer replicas"
            )
        if f["update_overhead"] > 0.3:
            return (
                f"overhead bound: {f['update_overhead']:.0%} of step time in the update and "
                "per-step overhead; try a larger batch or --steps-per-execution"
            )
        tries = [
            t
            for t, on in (
                ("--precision bf16 (or fp16 on GPUs)", self.precision == "fp32"),
                ("--xla", not self.xla),
            )
            if on
        ]
        return f"compute bound: {f['compute']:.0%} of step time in forward/backward; " + (
            f"try {' or '.join(tries)}" if tries else "more or faster devices"
        )

    def describe(self) -> str:
        f = self.fractions()
        usage = []
        if self.cpu_percent is not None:
            usage.append(f"CPU {self.cpu_percent:.0f}%")
        if self.gpu_percent is not None:
            usage.append(f"GPU {self.gpu_percent:.0f}%")
        return (
            f"profile, per step of {self.step_s * 1e3:.2f} ms: input wait "
            f"{f['input_wait']:.0%} (input: {self.input_source}; the pipeline alone makes "
            f"a global batch in {self.input_batch_s * 1e3:.2f} ms), compute "
            f"{f['compute']:.0%}, all-reduce {f['all_reduce']:.0%}, update+overhead "
            f"{f['update_overhead']:.0%}"
            + (f"; utilisation {', '.join(usage)}" if usage else "")
            + f"\n{self.diagnosis()}"
        )

    def as_dict(self) -> dict:
        return {**asdict(self), "fractions": self.fractions(), "diagnosis": self.diagnosis()}


__all__ = ["ProfileReport"]
