"""The summary every door prints first: the verdict, the symptoms one line each, the numbers that
matter, and where the rest is. One screen; the fix reports and evidence follow only with --details
(and always in Markdown, HTML and JSON).
"""

from __future__ import annotations

from collections import Counter

from torchdoctor.model import SEVERITIES, SEVERITY_RANK, Report, Symptom
from torchdoctor.render.document import Block, Bullets, Section, Table, Text

# What --details adds, per door: the summary's pointer says so in these words.
DETAILS = {
    "check": "the findings with their code frames, the evidence and the fix reports",
    "run": "every probe's numbers, the evidence and the fix reports",
    "demo": "the findings with their code frames, every probe's numbers, the evidence and the fix reports",
}
DETAILS_DEFAULT = "the evidence and the fix reports"
MAX_ROWS = 20  # symptoms listed one line each; past this the rest are counted (errors come first)
WHERE_WIDTH = 26  # a longer file:line keeps its end: the file name and the line say the most


def summary_blocks(report: Report, details: bool) -> list[Block]:
    """The summary; `details` says whether the full report follows it (then no pointer to --details)."""
    blocks: list[Block] = [Text(note, "dim") for note in report.notes]
    if report.run is not None:
        from torchdoctor.render.run_summary import outcome_blocks

        blocks += outcome_blocks(report.run)
    if report.question is not None:
        return blocks  # the question is the whole answer (compose adds it)
    ranked = rank(report.symptoms)
    blocks.append(Text(verdict(ranked), "bold" if ranked else "ok"))
    if report.reports:  # the first specialist on the route says what is wrong, in one or two sentences
        blocks.append(Text(report.reports[0].diagnosis))
    if ranked:
        shown = ranked if details else ranked[:MAX_ROWS]  # with the full report there is no screen to fit
        header, rows = _filled(["severity", "symptom", "where", "first fix"], [symptom_row(s, report) for s in shown])
        table: list[Block] = [Table(header, rows, [s.severity for s in shown])]
        if len(ranked) > len(shown):
            table.append(Text(f"… and {_counted(ranked[len(shown):])}: --details lists every one.", "dim"))
        blocks.append(Section("Symptoms", table))
    if report.run is not None:
        from torchdoctor.render.run_summary import key_numbers

        numbers = key_numbers(report.run)
        if numbers:
            blocks.append(Section("Measured", [Text(" · ".join(numbers))]))
    where = _where(report, details)
    if where:
        blocks.append(Section("More", [Bullets(where)]))
    return blocks


def rank(symptoms: list[Symptom]) -> list[Symptom]:
    """Errors first, then warnings, then information; within one severity, as the door found them."""
    return sorted(symptoms, key=lambda s: -SEVERITY_RANK.get(s.severity, 0))


def verdict(ranked: list[Symptom]) -> str:
    if not ranked:
        return "No symptoms found."
    first = ranked[0]
    at = f" at {first.location}" if first.location is not None and first.location.line else ""
    return f"{_counted(ranked)}; start with {first.id}{at}."


def _counted(symptoms: list[Symptom]) -> str:
    """'7 symptoms (4 errors, 3 warnings)'."""
    counts = Counter(s.severity for s in symptoms)
    parts = [f"{counts[s]} {s}{'s' if counts[s] != 1 and s != 'info' else ''}" for s in SEVERITIES if counts[s]]
    noun = "symptom" if len(symptoms) == 1 else "symptoms"
    return f"{len(symptoms)} {noun} ({', '.join(parts)})"


def symptom_row(s: Symptom, report: Report) -> list[str]:
    """severity, symptom id (with the rule codes behind it), the user's file:line (or the step), the fix
    in a phrase."""
    return [s.severity, s.id + rule_codes(s), where(s), lead_fix(s, report)]


def rule_codes(s: Symptom) -> str:
    """' TD401' or ' TD401,TD402': the codes a user passes to --ignore, `explain` or a suppression comment."""
    codes = sorted({ev.source for ev in s.evidence if ev.kind == "static" and ev.source})
    return f" {','.join(codes)}" if codes else ""


def where(s: Symptom) -> str:
    loc = s.location
    if loc is not None and loc.line:
        # `check` merges one symptom's findings across lines and files: name the first, count the others
        others = {str(ev.location) for ev in s.evidence if ev.location is not None and ev.location.line} - {str(loc)}
        text = str(loc) if len(str(loc)) <= WHERE_WIDTH else "…" + str(loc)[-(WHERE_WIDTH - 1):]
        if others:
            text += f" +{len(others)}"
    elif s.step is not None:
        text = f"step {s.step}"
    else:
        text = loc.path if loc is not None else ""
    if s.rank is not None:
        text = f"{text}, rank {s.rank}" if text else f"rank {s.rank}"
    return text


def lead_fix(s: Symptom, report: Report) -> str:
    """The title of the fix the symptom's specialist wrote first for it; its catalogue title if none."""
    for fix_report in report.reports:
        if s.id in fix_report.leads:
            return fix_report.leads[s.id]
    return s.title


def _filled(header: list[str], rows: list[list[str]]) -> tuple[list[str], list[list[str]]]:
    """The table without the columns that are empty in every row (no location anywhere, say)."""
    keep = [i for i in range(len(header)) if i == len(header) - 1 or any(row[i] for row in rows)]
    return [header[i] for i in keep], [[row[i] for i in keep] for row in rows]


def _where(report: Report, details: bool) -> list[str]:
    lines = []
    # the page for people where one was written (the demo's shows both doors), report.json, then the evidence
    pages = [v for v in report.artifacts.values() if v.endswith(".html")]
    lines += [f"Full report, with charts: {page}" for page in pages]
    json_file = report.artifacts.get("report")
    if json_file:
        lines.append(f"{'The run' if report.command == 'demo' else 'The report'} as JSON: {json_file}")
    reports = [*pages, json_file]
    run_dir = report.artifacts.get("run_dir")
    if run_dir:
        kept = [k for k, v in report.artifacts.items() if k != "run_dir" and v not in reports]
        lines.append(f"Evidence: {run_dir}" + (f" ({', '.join(kept)})" if kept else ""))
    if not details and (report.symptoms or report.findings or report.reports or report.run is not None):
        # a watch() block's report is read in Python, where the option is an argument (doctor/watching.py)
        in_python = (report.target or "").startswith("torchdoctor.watch()")
        how = "`session.render(details=True)`" if in_python else "`--details`"
        lines.append(f"{how} prints {DETAILS.get(report.command, DETAILS_DEFAULT)} here.")
    return lines
