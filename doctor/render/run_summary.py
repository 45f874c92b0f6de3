"""The `run` part of a report: how it ended, the few numbers that matter, and every probe's numbers."""

from __future__ import annotations

from torchdoctor.clip import clip
from torchdoctor.model import Report, RunInfo
from torchdoctor.render.document import Block, Bullets, Section, Text
from torchdoctor.stopped import ending

# The numbers the summary shows for a run, in this order: (slot, probe, keys, how they read). Within a
# slot the first row whose keys were all measured wins (CUDA memory before RSS, the gradflow probe's
# loss before the nan probe's). `nonzero`: shown only when the number is not 0.
KEY_NUMBERS: tuple[tuple[str, str, tuple[str, ...], str, bool], ...] = (
    ("step time", "steps", ("step_time_median_ms",), "{0:.1f} ms per step (median)", False),
    ("memory", "memory", ("cuda_peak_mib",), "CUDA peak {0:.0f} MiB", False),
    ("memory", "memory", ("peak_rss_mib",), "peak RSS {0:.0f} MiB", False),
    ("loss", "gradflow", ("loss_first", "loss_last"), "loss {0:.4g} → {1:.4g}", False),
    ("loss", "nan", ("loss_first", "loss_last"), "loss {0:.4g} → {1:.4g}", False),
    ("non-finite", "nan", ("nonfinite_loss_steps",), "non-finite loss on {0:.0f} steps", True),
    ("data wait", "data", ("data_wait_fraction",), "waiting for data {0:.1%} of the step", False),
)


def outcome_line(run: RunInfo) -> str:
    text = f"The script {ending(run.stopped).says}"
    details = [f"{run.steps_completed} optimizer step{'s' if run.steps_completed != 1 else ''}",
               f"{run.duration_s:.1f} s"]
    if run.exit_code is not None:
        details.append(f"exit code {run.exit_code}")
    if run.signal:
        details.append(run.signal)
    if run.ranks > 1:
        details.append(f"{run.ranks} ranks")
    return f"{text}: {', '.join(details)}."


def outcome_blocks(run: RunInfo) -> list[Block]:
    """How the run ended, and its uncaught exception with the user's line."""
    blocks: list[Block] = [Text(outcome_line(run), ending(run.stopped).style)]
    if run.error is not None:
        where = f" at {run.error.location}" if run.error.location and run.error.location.line else ""
        code = f" (`{run.error.location.code}`)" if run.error.location and run.error.location.code else ""
        step = f", after {run.error.step} steps" if run.error.step is not None else ""
        blocks.append(Text(f"{run.error.type}: {clip(run.error.message, 300, one_line=True)}{where}{code}{step}", "error"))
    return blocks


def key_numbers(run: RunInfo) -> list[str]:
    """The few measured numbers a reader wants first, as short phrases (KEY_NUMBERS)."""
    shown: dict[str, str] = {}
    for slot, probe, keys, form, nonzero in KEY_NUMBERS:
        values = [_number(run.measurements.get(probe, {}).get(key)) for key in keys]
        if slot in shown or any(v is None for v in values) or (nonzero and not any(values)):
            continue
        shown[slot] = form.format(*values)
    return list(shown.values())


def _number(value: object) -> float | None:
    """A measured number; the JSON spells a non-finite loss as the string "nan" or "inf"."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def run_blocks(report: Report) -> list[Block]:
    """Every probe's numbers and the run's files: the details behind the summary."""
    run = report.run
    if run is None:
        return []
    blocks: list[Block] = []
    measured = [
        f"{name}: {numbers['summary']}" if isinstance(numbers.get("summary"), str) else f"{name}: {_pairs(numbers)}"
        for name, numbers in run.measurements.items()
        if numbers
    ]
    if measured:
        blocks.append(Section("Measured by each probe", [Bullets(measured)]))
    if report.artifacts:
        blocks.append(Section("Artifacts", [Bullets([f"{k}: {v}" for k, v in report.artifacts.items()])]))
    return [Section("Run", blocks)] if blocks else []


def _pairs(numbers: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in numbers.items() if not isinstance(v, (dict, list)))
