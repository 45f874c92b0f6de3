"""The `run` part of a report: how it ended, steps, duration, the numbers per probe, artifacts."""

from __future__ import annotations

from torchdoctor.model import Report, RunInfo
from torchdoctor.render.document import Block, Bullets, Section, Text
from torchdoctor.stopped import ending


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


def run_blocks(report: Report) -> list[Block]:
    run = report.run
    if run is None:
        return []
    blocks: list[Block] = []
    blocks.append(Text(outcome_line(run), ending(run.stopped).style))
    if run.error is not None:
        where = f" at {run.error.location}" if run.error.location and run.error.location.line else ""
        code = f" (`{run.error.location.code}`)" if run.error.location and run.error.location.code else ""
        step = f", after {run.error.step} steps" if run.error.step is not None else ""
        blocks.append(Text(f"{run.error.type}: {_clip(run.error.message)}{where}{code}{step}", "error"))
    measured = [
        f"{name}: {numbers['summary']}" if isinstance(numbers.get("summary"), str) else f"{name}: {_pairs(numbers)}"
        for name, numbers in run.measurements.items()
        if numbers
    ]
    if measured:
        blocks.append(Section("Measured", [Bullets(measured)]))
    if report.artifacts:
        blocks.append(Section("Artifacts", [Bullets([f"{k}: {v}" for k, v in report.artifacts.items()])]))
    return [Section("Run", blocks)]


def _pairs(numbers: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in numbers.items() if not isinstance(v, (dict, list)))


def _clip(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
