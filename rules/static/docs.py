"""`torchdoctor rules` and `torchdoctor explain`: the rule docs (TOML data) as text, Markdown or JSON."""

from __future__ import annotations

import json
import sys
from typing import TextIO

from torchdoctor import exitcodes
from torchdoctor.rules.static import registry
from torchdoctor.rules.static.api import RuleDoc

FORMATS = ("text", "json", "markdown")


class _Placeholder(dict):
    """Show a message template's fields as <field> when no finding fills them."""

    def __missing__(self, key: str) -> str:
        return f"<{key}>"


def template(text: str) -> str:
    return text.format_map(_Placeholder())


def rule_rows() -> list[dict[str, str]]:
    return [
        {
            "code": r.doc.code,
            "name": r.doc.name,
            "severity": r.doc.level,
            "specialist": r.doc.specialist,
            "symptom": r.doc.symptom,
            "summary": r.doc.summary,
        }
        for r in registry.rules().values()
    ]


def _bad_format(fmt: str) -> int:
    sys.stderr.write(f"torchdoctor: unknown format {fmt!r}; choose one of: {', '.join(FORMATS)}\n")
    return exitcodes.USAGE


def print_rules(fmt: str = "text", stream: TextIO | None = None) -> int:
    stream = stream or sys.stdout
    if fmt not in FORMATS:
        return _bad_format(fmt)
    rows = rule_rows()
    if fmt == "json":
        stream.write(json.dumps(rows, indent=2) + "\n")
    elif fmt == "markdown":
        stream.write("| code | name | severity | specialist | symptom | summary |\n| --- | --- | --- | --- | --- | --- |\n")
        for r in rows:
            stream.write(f"| {r['code']} | {r['name']} | {r['severity']} | {r['specialist']} | `{r['symptom']}` | {r['summary']} |\n")
    else:
        width = max(len(r["name"]) for r in rows)
        for r in rows:
            stream.write(f"{r['code']}  {r['severity']:<7}  {r['specialist']:<15}  {r['name']:<{width}}  {r['summary']}\n")
    return exitcodes.OK


def find(code_or_name: str) -> RuleDoc | None:
    found = registry.get(code_or_name.strip()) or registry.by_name(code_or_name.strip().lower())
    return found.doc if found is not None else None


def _level(doc: RuleDoc) -> str:
    if not doc.calibrated:
        return doc.severity
    return (f"{doc.level} (by its record on real code; `severity = {{ {doc.code} = \"{doc.severity}\" }}` in "
            f"[tool.torchdoctor] makes it {doc.severity})")


def explanation_blocks(doc: RuleDoc) -> list:
    from torchdoctor.render.document import Code, Heading, Section, Text

    return [
        Heading(f"{doc.code} {doc.name}"),
        Text(f"{_level(doc)} · specialist: {doc.specialist} · symptom: {doc.symptom}", "dim"),
        Text(doc.summary, "bold"),
        Section("Why", [Text(" ".join(p.split()) ) for p in _paragraphs(doc.why)]),
        Section("Example that fires", [Code(doc.bad)]),
        Section("Fixed", [Code(doc.good)]),
        Section("What the finding says", [Text(template(doc.message)), Text("Fix: " + template(doc.fix))]),
        Text(f"Silence one line with `# torchdoctor: ignore[{doc.code}]`, or add {doc.code} to `ignore` in [tool.torchdoctor].", "dim"),
    ]


def _paragraphs(text: str) -> list[str]:
    return [p for p in text.strip().split("\n\n") if p.strip()]


def help_markdown(doc: RuleDoc) -> str:
    """The rule's help as Markdown (SARIF `help.markdown`)."""
    from torchdoctor.render import markdown

    return markdown.render(explanation_blocks(doc)[2:])


def help_text(doc: RuleDoc) -> str:
    why = "\n\n".join(" ".join(p.split()) for p in _paragraphs(doc.why))
    return f"{doc.summary}\n\n{why}\n\nExample that fires:\n{doc.bad}\n\nFixed:\n{doc.good}\n"


def print_explanation(code: str, fmt: str = "text", stream: TextIO | None = None) -> int:
    stream = stream or sys.stdout
    if fmt not in FORMATS:
        return _bad_format(fmt)
    doc = find(code)
    if doc is None:
        sys.stderr.write(f"torchdoctor: unknown rule {code!r} (see `torchdoctor rules` for the list)\n")
        return exitcodes.USAGE
    if fmt == "json":
        fields = ("code", "name", "severity", "specialist", "symptom", "summary", "message", "fix", "why", "bad", "good")
        row = {f: getattr(doc, f) for f in fields}
        row["severity"] = doc.level
        if doc.calibrated:
            row["claim_severity"] = doc.severity  # the level `severity = {...}` in the config restores
        stream.write(json.dumps(row, indent=2) + "\n")
        return exitcodes.OK
    from torchdoctor.render import render_blocks

    render_blocks(explanation_blocks(doc), fmt, stream)
    return exitcodes.OK
