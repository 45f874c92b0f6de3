"""Parent-side classification of a run's evidence into symptoms (pure Python, no torch).

After the script ended — however it ended — the runner reads the evidence
streams (`RunEvidence`, analysis/evidence.py) and calls `analyse(run)`:

1. the runner's own analysers: `faults` (the script's exception through the
   triage desk's error signatures, a fatal signal's stacks, a hang's stacks,
   a kill) and `steps` (how many, how fast);
2. the analysis of each probe that ran, `torchdoctor.analysis.<name>`
   (the `analysis` column of the probe table in `torchdoctor.probes`).

Every analyser is a function `analyse(run: RunEvidence) -> Analysis`.
Thresholds come from rules/data/thresholds.toml via `run.limits(name)`;
symptoms are built with `run.symptom(id, probe=…, summary=…, values=…)`
(values carry their unit in the key: `slope_mib_per_step`, `peak_gib`; every key is
declared with its type, unit and `probe:<name>` producer in rules/data/evidence.toml, and
tests/test_evidence.py and TORCHDOCTOR_CHECK_EVIDENCE=1 fail on one that is not).
One analyser failing (a bug) costs its own findings, never the report: it
becomes a note (set TORCHDOCTOR_DEBUG=1 to raise instead).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from importlib import import_module
from typing import Any

from torchdoctor.analysis.evidence import RunEvidence
from torchdoctor.model import RunError, Symptom

CORE = ("faults", "steps")


@dataclass
class Analysis:
    """What one analyser concluded."""

    symptoms: list[Symptom] = field(default_factory=list)
    measurements: dict[str, Any] = field(default_factory=dict)  # numbers with their unit in the key; "summary": one line
    notes: list[str] = field(default_factory=list)
    environment: dict[str, Any] = field(default_factory=dict)
    contexts: list[str] = field(default_factory=list)
    artifacts: dict[str, str] = field(default_factory=dict)
    error: RunError | None = None


@dataclass
class RunAnalysis:
    """Everything the analysers concluded, merged."""

    symptoms: list[Symptom] = field(default_factory=list)
    measurements: dict[str, dict[str, Any]] = field(default_factory=dict)  # analyser name -> numbers
    notes: list[str] = field(default_factory=list)
    environment: dict[str, Any] = field(default_factory=dict)
    contexts: list[str] = field(default_factory=list)
    artifacts: dict[str, str] = field(default_factory=dict)
    error: RunError | None = None

    def absorb(self, name: str, part: Analysis) -> None:
        self.symptoms += part.symptoms
        if part.measurements:
            self.measurements[name] = part.measurements
        self.notes += [n for n in part.notes if n not in self.notes]
        self.environment.update(part.environment)
        self.contexts += [c for c in part.contexts if c not in self.contexts]
        self.artifacts.update(part.artifacts)
        self.error = self.error or part.error


def analysers(run: RunEvidence) -> list[tuple[str, str]]:
    """(name, module) of every analyser that applies to this run, core ones first."""
    from torchdoctor.probes import PROBES

    out = [(name, f"torchdoctor.analysis.{name}") for name in CORE]
    out += [(name, PROBES[name].analysis) for name in run.probes if name in PROBES]
    return out


def analyse(run: RunEvidence) -> RunAnalysis:
    total = RunAnalysis()
    for name, module in analysers(run):
        try:
            part = import_module(module).analyse(run)
        except Exception as exc:  # noqa: BLE001 - one analyser's bug must not cost the report
            if os.environ.get("TORCHDOCTOR_DEBUG"):
                raise
            total.notes.append(
                f"torchdoctor could not analyse the {name} evidence (internal error: {type(exc).__name__}: {exc}); "
                "the raw events are in the run directory."
            )
            continue
        total.absorb(name, part)
    return total
