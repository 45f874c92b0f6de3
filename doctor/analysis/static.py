"""`check` inside `run`: the static rules read the script that ran, and agree with the measurements.

After the probes' analyses, the runner hands their symptoms here. The check
engine reads the target script — only that file, never importing it: one
parse and one walk, a few tens of milliseconds — with the project's
`[tool.torchdoctor]` selection if there is one. A static finding whose
symptom was also measured is added as a symptom of its own with the
measured one's rank; `diagnosis.diagnose` then merges the two (same id and
rank) into one symptom whose evidence holds both the probe's numbers and
the rule's line. Static findings nothing measured are listed in one note
(they are `torchdoctor check`'s to gate on: a run's exit code stays about
what was measured).

`TORCHDOCTOR_RUN_CHECK=0` in the environment turns this off.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from torchdoctor.model import Symptom
from torchdoctor.probes.userframes import display_path

ENV = "TORCHDOCTOR_RUN_CHECK"


def script_path(script: str | None, module: str | None, cwd: str) -> Path | None:
    """The file `run` executed: the script, its directory's __main__.py, or a module's file under cwd."""
    if script:
        path = Path(cwd) / script
        if path.is_dir():
            path = path / "__main__.py"
    elif module:
        base = Path(cwd, *module.split("."))
        path = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__main__.py"
    else:
        return None
    return path if path.is_file() and path.suffix in (".py", ".ipynb") else None


def static_results(path: Path, cwd: str) -> list[Any]:
    """The check engine's results for one file (TD000, an unreadable file, left out)."""
    from torchdoctor.config import ConfigError, Settings, load
    from torchdoctor.rules.static import registry
    from torchdoctor.rules.static.engine import Options, analyse_file

    try:
        settings = load(None, str(path))
    except ConfigError:
        settings = Settings()
    codes = tuple(r.code for r in registry.selected(settings.select, settings.ignore))
    options = Options(codes=codes, torch_version=settings.torch_version, max_bytes=settings.max_file_bytes)
    result = analyse_file(str(path), display_path(str(path), cwd), options)
    return [r for r in result.results if r.finding.code != "TD000" and r.finding.code in codes]


def add_static(plan: Any, found: Any) -> None:
    """Add the static findings that agree with a measured symptom to `found` (a RunAnalysis)."""
    if os.environ.get(ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return
    try:
        _add_static(plan, found)
    except Exception as exc:  # noqa: BLE001 - a rule's bug costs the static evidence, never the report
        if os.environ.get("TORCHDOCTOR_DEBUG"):
            raise
        found.notes.append(f"torchdoctor could not read the script statically ({type(exc).__name__}: {exc}); "
                           "the measurements stand on their own.")


def _add_static(plan: Any, found: Any) -> None:
    path = script_path(plan.script, plan.module, plan.cwd)
    if path is None:
        return
    from torchdoctor.check import symptom_of

    results = static_results(path, plan.cwd)
    if not results:
        found.measurements["check"] = {"findings": 0, "summary": f"no static findings in {_shown(path, plan.cwd)}"}
        return
    ranks: dict[str, list[int | None]] = {}
    for s in found.symptoms:
        ranks.setdefault(s.id, [])
        if s.rank not in ranks[s.id]:
            ranks[s.id].append(s.rank)
    confirmed, unconfirmed = [], []
    added: list[Symptom] = []
    for result in results:
        f = result.finding
        if f.symptom in ranks:
            confirmed.append(f)
            for rank in ranks[f.symptom]:
                symptom = symptom_of(result)
                symptom.rank = rank
                added.append(symptom)
        else:
            unconfirmed.append(f)
    found.symptoms += added
    found.measurements["check"] = {
        "findings": len(results),
        "confirmed": [f"{f.code} {_line(f)}" for f in confirmed],
        "not_measured": [f"{f.code} {_line(f)}" for f in unconfirmed],
        "summary": f"{len(results)} static finding{'s' if len(results) != 1 else ''} in {_shown(path, plan.cwd)}, "
        f"{len(confirmed)} confirmed by the run",
    }
    if unconfirmed:
        listed = ", ".join(f"{f.code} {f.name} ({_line(f)})" for f in unconfirmed[:5])
        more = f" and {len(unconfirmed) - 5} more" if len(unconfirmed) > 5 else ""
        found.notes.append(
            f"`torchdoctor check` also flags, in {_shown(path, plan.cwd)}: {listed}{more} — not confirmed by this "
            f"run's measurements; `torchdoctor check {_shown(path, plan.cwd)}` explains them."
        )


def _line(f: Any) -> str:
    """'line 19', or for a notebook 'cell 3, line 4' (as `check` words it)."""
    return f"cell {f.cell}, line {f.line}" if f.cell else f"line {f.line}"


def _shown(path: Path, cwd: str) -> str:
    return display_path(str(path), cwd)
