"""Report -> document blocks, shared by the plain, rich, Markdown and HTML formats.

The summary comes first (render/summary.py); with `details` the full report follows it: every
probe's numbers, the findings with their code frames, the symptoms with their evidence, the route and
the specialists' fix reports.
"""

from __future__ import annotations

from torchdoctor.clip import clip
from torchdoctor.model import Fix, FixReport, Report, Symptom
from torchdoctor.render.document import Block, Bullets, Code, Heading, Section, Text


def compose(report: Report, details: bool = True) -> list[Block]:
    from torchdoctor.render.summary import summary_blocks

    blocks: list[Block] = [Heading(_title(report)), *summary_blocks(report, details)]
    if report.question is not None:
        blocks.append(_question(report))
        return blocks
    if details and (report.run is not None or report.findings or report.symptoms):
        blocks.append(Heading("Details", level=2))
        blocks += detail_blocks(report)
    return blocks


def detail_blocks(report: Report) -> list[Block]:
    blocks: list[Block] = []
    if report.run is not None:
        from torchdoctor.render.run_summary import run_blocks

        blocks += run_blocks(report)
    if report.findings:
        from torchdoctor.render.findings import findings_blocks

        blocks += findings_blocks(report)
    if report.symptoms:
        blocks.append(_symptoms(report.symptoms))
    if report.route:
        blocks.append(
            Section(
                "Route",
                [Bullets([f"{step.specialist} — {step.why}" for step in report.route], numbered=True)],
            )
        )
    for n, fix_report in enumerate(report.reports, 1):
        blocks.append(_fix_report(n, fix_report))
    return blocks


def _title(report: Report) -> str:
    if report.command == "ask":
        return "torchdoctor ask"
    if report.target:
        return f"torchdoctor {report.command} {report.target}"
    return f"torchdoctor {report.command}"


def _symptoms(symptoms: list[Symptom]) -> Section:
    blocks: list[Block] = []
    for s in symptoms:
        where = ""
        if s.location is not None and s.location.line:
            where = f" at {s.location}"
        if s.step is not None:
            where += f", step {s.step}"
        if s.rank is not None:
            where += f", rank {s.rank}"
        sure = "" if s.confidence >= 0.95 else f" (confidence {s.confidence:.0%})"
        blocks.append(Text(f"{s.id} — {s.title}{where}{sure}", _SEVERITY_STYLE.get(s.severity, "")))
        given_away = []
        doors = len({ev.kind for ev in s.evidence}) > 1  # merged from several doors: say which said what
        shown = s.evidence[:4]
        shown += [ev for i, ev in enumerate(s.evidence) if i >= 4 and ev.kind not in {e.kind for e in s.evidence[:i]}]
        for ev in shown:
            line = ev.summary
            if ev.quote and ev.kind in ("error", "text") and ev.quote not in line:
                line = line.rstrip(".") + f': "{clip(ev.quote, 160, one_line=True)}"'
            if doors:
                line = f"{_door(ev)}: {line}"
            given_away.append(line)
        if given_away:
            blocks.append(Bullets(given_away))
    return Section("Evidence", blocks)


def _fix_report(n: int, fr: FixReport) -> Section:
    # The evidence behind it is shown once, per symptom, above (its `evidence` stays in the JSON): two
    # specialists sharing a symptom printed the same lines twice. The first diagnosis is the summary's.
    blocks: list[Block] = [] if n == 1 else [Text(fr.diagnosis, "bold")]
    for i, fix in enumerate(fr.fixes, 1):
        blocks += _fix(i, fix)
    if fr.next_steps:
        blocks.append(Text("Next diagnostic step", "dim"))
        blocks.append(Bullets(fr.next_steps))
    return Section(f"{n}. {fr.name}", blocks)


def _fix(i: int, fix: Fix) -> list[Block]:
    where = f" ({fix.location})" if fix.location is not None and fix.location.line else ""
    out: list[Block] = [Text(f"Fix {i}: {fix.title}{where}", "info")]
    if fix.applies_when:
        out.append(Text(f"Applies when: {fix.applies_when}", "dim"))
    if fix.snippet:
        from torchdoctor.specialists.base import is_shell

        out.append(Code(fix.snippet, "bash" if is_shell(fix.snippet) else "python"))
    out.append(Text(f"Why: {fix.why}"))
    out.append(Text(f"Verify: {fix.verify}"))
    return out


def _question(report: Report) -> Section:
    q = report.question
    assert q is not None
    items = [c.label for c in q.choices]
    return Section(
        "One question first",
        [
            Text(q.text, "bold"),
            Bullets(items, numbered=True),
            Text("Answer with `torchdoctor ask --answer N \"…\"`, or describe the problem in more detail.", "dim"),
        ],
    )


_SEVERITY_STYLE = {"error": "error", "warning": "warning", "info": "info"}
_DOORS = {"probe": "measured", "static": "in the source", "error": "the error", "text": "you said"}


def _door(ev) -> str:
    door = _DOORS.get(ev.kind, ev.kind)
    if ev.kind == "static" and ev.location is not None and ev.location.line:
        loc = ev.location
        door += f" (cell {loc.cell}, line {loc.line})" if loc.cell else f" (line {loc.line})"
    return door


# The pieces the HTML report's symptom cards reuse (render/html_page.py), so a fix report reads the same there.
fix_report_section = _fix_report
evidence_door = _door
