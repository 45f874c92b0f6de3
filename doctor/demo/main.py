"""`torchdoctor demo`: the bundled example, diagnosed with every door that exists."""

from __future__ import annotations

from torchdoctor import exitcodes


def run_demo(fmt: str) -> int:
    from torchdoctor.ask import build_report
    from torchdoctor.render import render

    report = build_report("Getting OOM after a few batches, and memory grows every step")
    render(report, fmt)
    return exitcodes.OK
