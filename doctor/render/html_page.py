"""report.html: one self-contained page per run (or per `check --format html`).

The page is built from the Report (symptoms, fix reports, environment) and,
for a run, the run directory's per-step records (run_series.py) drawn as
inline SVG (svg_chart.py). It has no script, no external style sheet, font or
image, and no link that fetches anything: it opens offline. Links to the run
directory's own files (the profiler trace, a CUDA memory snapshot) are
relative, so the folder can be copied or uploaded as a CI artifact whole.

What a chart shows was measured; where a run did not measure something, the
page says "not measured" and why, instead of drawing a guess.
"""

from __future__ import annotations

import linecache
import os
import re
import statistics
from html import escape
from pathlib import Path
from typing import Any

from torchdoctor.model import Location, Report, Symptom
from torchdoctor.render import html
from torchdoctor.render.document import Block, Bullets, Frame, Section, Text
from torchdoctor.render.run_series import RunSeries, Series, read_run
from torchdoctor.render.svg_chart import Chart, Line, bar_chart, fmt, legend, line_chart, parts_legend

# What of a holder grows (run_series holder key) -> the memory analysis's value that says so (analysis/memory.py).
HOLDER_GROWTH = {"graph_nodes": "graph_nodes_growth_per_step", "tensors": "tensors_growth_per_step",
                 "mib": "holder_mib_per_step"}
FRAME_CONTEXT = 3  # source lines either side of a symptom's line in its card
MAX_RANK_LINES = 8  # ranks drawn one line each on the per-rank timeline; past this, a chosen few
LOG_SPAN = 100.0  # a positive series whose max/min exceeds this is drawn on a log scale (gradient norms)

CONTENTS = (("charts", "Per step"), ("ranks", "Ranks"), ("symptoms", "Symptoms"), ("run", "The run"),
            ("findings", "Static findings"), ("environment", "Environment"), ("files", "Files"))

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto; max-width: 980px;
       padding: 1em 1.5em 3em; color: #1a1a1a; line-height: 1.45; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; }
h2 { border-bottom: 1px solid #ddd; padding-bottom: 0.2em; margin-top: 1.6em; }
.verdict { font-size: 1.1em; }
.error { color: #b00020; } .warning { color: #a15c00; } .info { color: #1a5fb4; } .ok { color: #26a269; }
.dim, .missing { color: #555; }
.missing { font-style: italic; }
figure { margin: 1em 0 1.4em; }
figcaption { font-weight: 600; margin-bottom: 0.3em; }
svg.chart { max-width: 100%; height: auto; display: block; }
.legend { font-size: 0.85em; color: #333; margin-top: 0.2em; }
.key { margin-right: 1.2em; white-space: nowrap; }
.swatch { display: inline-block; width: 1.6em; vertical-align: middle; margin-right: 0.4em; }
.note { font-size: 0.9em; color: #333; margin: 0.3em 0; }
table { border-collapse: collapse; font-size: 0.9em; }
td, th { border: 1px solid #ddd; padding: 0.2em 0.6em; text-align: left; vertical-align: top; }
th { background: #f4f4f4; }
.card { border: 1px solid #ddd; border-radius: 6px; padding: 0 1em; margin: 1em 0; }
code, pre { font-family: ui-monospace, "DejaVu Sans Mono", monospace; font-size: 0.9em; }
pre { overflow-x: auto; }
"""


def page(report: Report, run_dir: str | Path | None = None, cwd: str | None = None,
         written_to: str | Path | None = None, events: dict[int, list[dict[str, Any]]] | None = None) -> str:
    """The whole HTML document. `run_dir`: the run's folder (per-step charts, file links); None for `check`.
    `cwd`: where the report's relative paths start (source lines for the code frames). `written_to`: the
    folder the page will sit in, when not the run directory (the file links start there). `events`: the run's
    evidence already read (analysis/evidence.py `read_events`), so it is not read twice."""
    cwd = cwd or os.getcwd()
    series = read_run(run_dir, events) if run_dir is not None and Path(run_dir).is_dir() else None
    title = _title(report)
    body: list[str] = [f"<h1>{escape(title)}</h1>", _verdict(report)]
    body += [f'<p class="dim">{escape(note)}</p>' for note in report.notes]
    if report.symptoms:
        body.append(_symptom_index(report.symptoms))
    body.append(_charts(report, series))
    if series is not None and series.ranks:
        body.append(_ranks(report, series))
    if report.symptoms:
        body.append('<section id="symptoms"><h2>Symptoms</h2>')
        body += _cards(report, cwd)
        body.append("</section>")
    if report.run is not None:
        from torchdoctor.render.run_summary import run_blocks

        blocks: list[Block] = []
        for block in run_blocks(report):
            blocks += block.blocks if isinstance(block, Section) and block.title == "Run" else [block]
        # The artifacts are linked under "Files in the run directory"; the rest is the run's summary.
        blocks = [b for b in blocks if not (isinstance(b, Section) and b.title == "Artifacts")]
        body.append('<section id="run"><h2>The run</h2>')
        body.append(html.render(blocks))
        body.append("</section>")
    if report.findings:
        from torchdoctor.render.findings import findings_blocks

        body.append('<section id="findings"><h2>Static findings</h2>')
        body.append(html.render(findings_blocks(report)))
        body.append("</section>")
    if report.environment:
        body.append(_environment(report.environment))
    if series is not None:
        base = "" if written_to is None else os.path.relpath(Path(run_dir), Path(written_to))  # type: ignore[arg-type]
        body.append(_files(series, "" if base == "." else base))
    version = escape(report.tool.get("version", ""))
    body.append(f'<p class="dim">Written by torchdoctor {version}; the numbers are in report.json '
                f"(schema {escape(report.schema_version)}).</p>")
    sections = [(anchor, name) for anchor, name in CONTENTS if any(f'<section id="{anchor}">' in part for part in body)]
    nav = ('<nav aria-label="contents"><p>' + " · ".join(f'<a href="#{a}">{escape(n)}</a>' for a, n in sections)
           + "</p></nav>")
    body.insert(2, nav)
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{escape(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n"
        + "\n".join(part for part in body if part)
        + "\n</body>\n</html>\n"
    )


# In a notebook the fragment sits inside Jupyter's own page: only the charts' own rules, scoped to the fragment,
# so the notebook's styles are left alone.
FRAGMENT_CSS = (".torchdoctor-charts svg.chart { max-width: 100%; height: auto; display: block; } "
                ".torchdoctor-charts figcaption { font-weight: 600; } "
                ".torchdoctor-charts .missing, .torchdoctor-charts .note { color: #555; font-size: 0.9em; } "
                ".torchdoctor-charts .key { margin-right: 1.2em; white-space: nowrap; } "
                ".torchdoctor-charts .swatch { display: inline-block; width: 1.6em; vertical-align: middle; "
                "margin-right: 0.4em; }")


def charts_fragment(report: Report, run_dir: str | Path | None) -> str:
    """The per-step charts of report.html as a fragment for a notebook cell (`watch()`'s `_repr_html_`).

    Empty when the run directory is gone: the summary above it still stands, and report.json says the rest.
    """
    if run_dir is None or not Path(run_dir).is_dir():
        return ""
    charts = _charts(report, read_run(run_dir))
    return f'<div class="torchdoctor-charts"><style>{FRAGMENT_CSS}</style>\n{charts}\n</div>'


def _title(report: Report) -> str:
    return f"torchdoctor {report.command} {report.target}" if report.target else f"torchdoctor {report.command}"


def _verdict(report: Report) -> str:
    worst = report.worst_severity()
    n = len(report.symptoms)
    if n:
        counts = ", ".join(f"{sum(s.severity == level for s in report.symptoms)} {level}"
                           for level in ("error", "warning", "info") if any(s.severity == level for s in report.symptoms))
        text = f"{n} symptom{'s' if n != 1 else ''} ({counts})"
    elif report.findings:
        text = f"{len(report.findings)} static finding{'s' if len(report.findings) != 1 else ''}"
    else:
        text = "No symptoms found"
    numbers = ""
    if report.run is not None:
        from torchdoctor.render.run_summary import key_numbers, outcome_blocks, outcome_line

        text = f"{outcome_line(report.run)} {text}."
        shown = key_numbers(report.run)
        if shown:
            numbers = f'<p class="numbers">{escape(" · ".join(shown))}</p>'
        error = outcome_blocks(report.run)[1:]  # the script's exception with its line, when it raised one
        if error:
            numbers = html.render(error) + numbers
    return f'<p class="verdict {worst or "ok"}">{escape(text)}</p>{numbers}'


def _anchor(s: Symptom, i: int) -> str:
    return f"symptom-{i}-{re.sub(r'[^a-z0-9-]', '-', s.id.lower())}"


def _symptom_index(symptoms: list[Symptom]) -> str:
    rows = []
    for i, s in enumerate(symptoms):
        where = str(s.location) if s.location is not None and s.location.line else ""
        if s.step is not None:
            where += f"{', ' if where else ''}step {s.step}"
        if s.rank is not None:
            where += f"{', ' if where else ''}rank {s.rank}"
        rows.append(f'<tr><td class="{escape(s.severity)}">{escape(s.severity)}</td>'
                    f'<td><a href="#{_anchor(s, i)}">{escape(s.id)}</a></td><td>{escape(s.title)}</td>'
                    f"<td>{escape(where)}</td></tr>")
    return ('<table aria-label="symptoms"><tr><th>severity</th><th>symptom</th><th>what</th><th>where</th></tr>'
            + "".join(rows) + "</table>")


# -- charts -------------------------------------------------------------------------------------


class _Figures:
    """Numbers the chart ids, so every `<svg>` title and description id is unique in the page."""

    def __init__(self, probes: list[str], first: int = 0) -> None:
        self.probes = probes  # the probes that ran: an empty chart of one that did not says so
        self.count = first

    def missing(self, what: str, key: str) -> str:
        row = _words()["not_measured"][key]
        probe, why = row["probe"], row["why"]
        if probe and probe not in self.probes:
            why = f"the {probe} probe did not run (`--probe {probe}` adds it)"
        return f'<p class="missing">{escape(what)}: not measured — {escape(why)}.</p>'

    def line(self, caption: str, chart: Chart, notes: list[str] | None = None) -> str:
        self.count += 1
        svg = line_chart(chart, f"chart-{self.count}")
        if not svg:
            return ""
        extra = "".join(f'<p class="note">{escape(n)}</p>' for n in notes or [])
        return f"<figure><figcaption>{escape(caption)}</figcaption>{svg}{legend(chart)}{extra}</figure>"

    def bars(self, caption: str, bars: list[tuple[str, float]], unit: str, notes: list[str] | None = None,
             highlight: set[str] | None = None, stacked: bool = False) -> str:
        self.count += 1
        svg = bar_chart(caption, bars, unit, f"chart-{self.count}", highlight or set(), stacked)
        extra = "".join(f'<p class="note">{escape(n)}</p>' for n in notes or [])
        key = parts_legend(bars, unit) if stacked else ""
        return f"<figure><figcaption>{escape(caption)}</figcaption>{svg}{key}{extra}</figure>" if svg else ""




def _charts(report: Report, series: RunSeries | None) -> str:
    out = ['<section id="charts"><h2>Per step</h2>']
    if series is None:
        if report.command == "run" or report.run is not None:
            out.append('<p class="missing">Not measured: the run directory was not found.</p>')
        else:
            out.append('<p class="missing">Nothing was run: `torchdoctor check` reads the source without running '
                       "it. `torchdoctor run` measures the loss, gradient norm, memory, step time, data wait and "
                       "learning rate of every step and draws them here.</p>")
        out.append("</section>")
        return "\n".join(out)
    per_step = (series.loss, series.grad_norm, series.rss, series.cuda_allocated, series.step_ms, series.data_wait)
    if report.run is not None and not report.run.steps_completed and not any(per_step):
        out.append('<p class="missing">No optimizer step was recorded, so nothing was measured per step.</p>')
        out.append("</section>")
        return "\n".join(out)
    figures = _Figures(report.run.probes if report.run is not None else [])
    out.append(_loss(series, figures))
    out.append(_grad_norm(series, figures))
    out.append(_memory(report, series, figures))
    out.append(_step_time(series, figures))
    out.append(_data_wait(series, figures))
    out.append(_lr(series, figures))
    out.append("</section>")
    return "\n".join(part for part in out if part)


def _marked(series: Series) -> str:
    if not series.nonfinite:
        return ""
    first = min(series.nonfinite)
    return f"; not finite at {len(set(series.nonfinite))} steps, the first at step {first}"


def _loss(series: RunSeries, figures: _Figures) -> str:
    s = series.loss
    if not s:
        return figures.missing("Loss", "loss")
    chart = Chart("Loss per optimizer step", "loss", [Line("loss", s.xs, s.ys)], marks=s.nonfinite)
    notes = [] if s.xs else ["No step recorded a finite loss."]
    return figures.line(f"Loss{_marked(s)}", chart, notes) or figures.missing("Loss", "loss")


def _grad_norm(series: RunSeries, figures: _Figures) -> str:
    s = series.grad_norm
    if not s:
        return figures.missing("Gradient norm", "grad_norm")
    log = bool(s.ys) and min(s.ys) > 0 and max(s.ys) / min(s.ys) > LOG_SPAN
    chart = Chart("Total gradient norm per optimizer step", "gradient norm", [Line("total gradient norm", s.xs, s.ys)],
                  marks=s.nonfinite, log_y=log)
    notes = [] if s.xs else ["No step recorded a finite gradient norm."]
    return figures.line(f"Gradient norm{_marked(s)}", chart, notes) or figures.missing("Gradient norm", "grad_norm")


def _memory(report: Report, series: RunSeries, figures: _Figures) -> str:
    growth = next((s for s in report.symptoms if s.id == "memory-growth"), None)
    byte_ev = next((ev for ev in growth.evidence if "slope_mib_per_step" in ev.values), None) if growth else None
    holders = [ev for ev in growth.evidence if ev.kind == "probe" and isinstance(ev.values.get("variable"), str)
               and any(k in ev.values for k in HOLDER_GROWTH.values())] if growth else []
    out = []
    for s, others, what in ((series.rss, [], "rss"),
                            (series.cuda_allocated, [series.cuda_reserved], "cuda_allocated")):
        if not s:
            continue
        lines = [Line(s.name, s.xs, s.ys)] + [Line(o.name, o.xs, o.ys, dashed=True) for o in others if o]
        notes = []
        if byte_ev is not None and byte_ev.values.get("series") == what:
            fit = _slope_line(s, byte_ev.values)
            if fit is not None:
                lines.append(Line(f"leak: {float(byte_ev.values['slope_mib_per_step']):+.3g} MiB per step", *fit,
                                  dashed=True))
            notes.append(byte_ev.summary)
        else:
            measured = (report.run.measurements.get("memory", {}) if report.run is not None else {}).get(
                f"{what}_slope_mib_per_step")
            if isinstance(measured, (int, float)):
                why = ("the leak was found in what a variable holds (below), not in this series" if growth is not None
                       else "no memory growth was found")
                notes.append(f"Slope after the warm-up steps: {measured:+.3g} MiB per step; {why}.")
        label = "RSS (process memory)" if what == "rss" else "CUDA memory"
        chart = Chart(f"{label} per optimizer step", "MiB", lines)
        out.append(figures.line(label, chart, notes))
    if not out:
        out.append(figures.missing("Memory", "memory"))
    elif not series.cuda_allocated:
        out.append('<p class="note">CUDA memory: not measured — CUDA was not used by the script.</p>')
    for ev in holders:
        out.append(_holder(ev, series, figures))
    return "\n".join(out)


def _slope_line(s: Series, values: dict[str, Any]) -> tuple[list[float], list[float]] | None:
    """The measured leak as a line over its window: the slope the analysis found, through the median offset."""
    slope = values.get("slope_mib_per_step")
    lo, hi = values.get("from_step"), values.get("to_step")
    if not isinstance(slope, (int, float)) or not isinstance(lo, int) or not isinstance(hi, int):
        return None
    window = [(x, y) for x, y in zip(s.xs, s.ys, strict=True) if lo <= x <= hi]
    if not window:
        return None
    offset = statistics.median(y - slope * x for x, y in window)
    return [float(lo), float(hi)], [offset + slope * lo, offset + slope * hi]


def _holder(ev: Any, series: RunSeries, figures: _Figures) -> str:
    """The variable that holds the leak, and what of it grows (graph nodes, tensors or MiB) per scan."""
    name = ev.values["variable"]
    found = series.holders.get(name, {})
    where = f" ({ev.location})" if isinstance(ev.location, Location) and ev.location.line else ""
    key = next((k for k, v in HOLDER_GROWTH.items() if v in ev.values), "mib")
    s = found.get(key)
    caption = f"What holds the leak: `{name}`{where}"
    if not s or not s.xs:
        return f'<p class="note">{escape(caption)}: {escape(ev.summary)}</p>'
    unit = {"graph_nodes": "autograd graph nodes", "tensors": "tensors held", "mib": "MiB held"}[key]
    chart = Chart(f"{unit} held by {name}, per memory scan", unit, [Line(f"{name}: {unit}", s.xs, s.ys)])
    return figures.line(caption, chart, [ev.summary])


def _step_time(series: RunSeries, figures: _Figures) -> str:
    out = []
    s = series.step_ms
    if s:
        chart = Chart("Time per optimizer step", "ms", [Line("step time (from one step to the next)", s.xs, s.ys)])
        out.append(figures.line("Step time", chart))
    else:
        out.append(figures.missing("Step time", "step_time"))
    split = series.split
    if split is not None:
        parts = [(name, ms) for name, ms in split.parts]
        note = (f"Measured by the profiler over steps {split.from_step}–{split.to_step}: {fmt(split.step_ms)} ms per "
                "step. Other: the step's time outside the four parts (Python between them, logging, host syncs).")
        out.append(figures.bars(f"Where a step's time goes (steps {split.from_step}–{split.to_step})", parts, "ms",
                                [note], stacked=True))
    else:
        out.append(figures.missing("Step-time split (data / forward / backward / optimizer / other)", "split"))
    return "\n".join(out)


def _data_wait(series: RunSeries, figures: _Figures) -> str:
    s = series.data_wait
    if not s:
        return figures.missing("Data wait", "data_wait")
    chart = Chart("Time each optimizer step waited for its batches", "ms", [Line("data wait", s.xs, s.ys)])
    return figures.line("Data wait", chart)


def _lr(series: RunSeries, figures: _Figures) -> str:
    measured = [s for s in series.lr if s.xs]
    planned = [s for s in series.lr_planned if s.xs]
    if not measured and not planned:
        return figures.missing("Learning rate", "lr")
    lines = [Line(f"measured, {s.name}", s.xs, s.ys) for s in measured]
    lines += [Line(f"planned: {s.name}", s.xs, s.ys, dashed=True) for s in planned]
    notes = []
    if measured and all(s.name.startswith("group 0 ") for s in measured):
        notes.append("The learning rate of the first parameter group; the others were not measured.")
    if len(measured) > 1 and "scheduler.step()" in measured[-1].name:
        notes.append("The gradient checks record the learning rate for a limited number of steps (the nan "
                     "probe's event budget); the first group's after each scheduler.step() covers the whole run.")
    if planned:
        notes.append("Planned curves (dashed): the scheduler replayed as it was built, and as the script steps it "
                     "(lr_curves.csv).")
    chart = Chart("Learning rate per optimizer step", "learning rate", lines)
    return figures.line("Learning rate", chart, notes)


def _ranks(report: Report, series: RunSeries) -> str:
    """DDP: every rank's step times on one timeline, and each rank's own work per step side by side."""
    figures = _Figures(report.run.probes if report.run is not None else [], first=100)  # ids apart from the others
    out = ['<section id="ranks"><h2>Ranks</h2>']
    stragglers = {f"rank {s.rank}" for s in report.symptoms if s.id == "straggler" and s.rank is not None}
    timed = [r for r in series.ranks if r.step_ms.xs]
    shown, note = _ranks_to_draw(timed, stragglers)
    lines = [Line(f"rank {r.rank}", r.step_ms.xs, r.step_ms.ys, dashed=i % 2 == 1) for i, r in enumerate(shown)]
    if lines:
        out.append(figures.line("Step time per rank", Chart("Time per optimizer step, per rank", "ms", lines),
                                [note] if note else None))
    else:
        out.append('<p class="missing">Step time per rank: not measured — no rank recorded two optimizer steps.</p>')
    own = [(f"rank {r.rank}", statistics.median(r.local_ms.ys)) for r in series.ranks if r.local_ms.ys]
    if own:
        note = ("The median over the run of each rank's own work per step (data and forward, before the gradient "
                "all-reduce): every rank waits for the slowest in the all-reduce.")
        if stragglers:
            note += f" Straggler (in red): {', '.join(sorted(stragglers))}."
        else:
            note += " No rank was slow enough, often enough, to be called a straggler."
        out.append(figures.bars("Own work per step, per rank (median)", own, "ms", [note], highlight=stragglers))
    else:
        steps = [(f"rank {r.rank}", statistics.median(r.step_ms.ys)) for r in series.ranks if r.step_ms.ys]
        if steps:
            out.append(figures.bars("Step time per rank (median)", steps, "ms",
                                    ["Own work before the all-reduce: not measured — the distributed probe times it "
                                     "for DDP-wrapped models (`--probe distributed`)."], highlight=stragglers))
    out.append("</section>")
    return "\n".join(out)


def _ranks_to_draw(ranks: list[Any], stragglers: set[str]) -> tuple[list[Any], str]:
    """Every rank up to MAX_RANK_LINES; past that the stragglers, the slowest, the median and the fastest rank
    (by median step time), so the chart stays readable on a multi-node job. The note says which were left out."""
    if len(ranks) <= MAX_RANK_LINES:
        return ranks, ""
    by_speed = sorted(ranks, key=lambda r: statistics.median(r.step_ms.ys))
    keep = {by_speed[0].rank, by_speed[len(by_speed) // 2].rank, by_speed[-1].rank}
    keep |= {r.rank for r in ranks if f"rank {r.rank}" in stragglers}
    shown = [r for r in ranks if r.rank in keep]
    return shown, (f"{len(shown)} of {len(ranks)} ranks drawn: the fastest, the median and the slowest by median "
                   "step time" + (", and the stragglers" if stragglers else "") + ".")


# -- symptom cards --------------------------------------------------------------------------------


def _cards(report: Report, cwd: str) -> list[str]:
    from torchdoctor.render.compose import evidence_door, fix_report_section

    shown: dict[int, str] = {}  # fix report index -> the anchor of the card that shows it
    out = []
    for i, s in enumerate(report.symptoms):
        anchor = _anchor(s, i)
        blocks: list[Block] = []
        where = _where(s)
        if where:
            blocks.append(Text(where, "dim"))
        frame = _frame(s.location, report, cwd)
        if frame is not None:
            blocks.append(frame)
        doors = len({ev.kind for ev in s.evidence}) > 1
        items = [f"{evidence_door(ev)}: {ev.summary}" if doors else ev.summary for ev in s.evidence]
        if items:
            blocks.append(Text("Evidence", "dim"))
            blocks.append(Bullets(list(dict.fromkeys(items))))
        later: list[str] = []
        for n, fr in enumerate(report.reports, 1):
            if s.id not in fr.symptoms:
                continue
            if n in shown:
                later.append(f'<p class="note">Fixes: {escape(fr.name)}, in the card of '
                             f'<a href="#{shown[n]}">{escape(_card_of(report, shown[n]))}</a>.</p>')
                continue
            shown[n] = anchor
            blocks.append(fix_report_section(n, fr))
        title = f"{s.severity}: {s.id} — {s.title}"
        out.append(f'<article class="card" id="{anchor}">'
                   + html.render([Section(title, blocks, style=s.severity)]) + "".join(later) + "</article>")
    return out


def _card_of(report: Report, anchor: str) -> str:
    for i, s in enumerate(report.symptoms):
        if _anchor(s, i) == anchor:
            return s.id
    return anchor


def _where(s: Symptom) -> str:
    parts = []
    if s.location is not None and s.location.line:
        parts.append(f"at {s.location}")
    if s.step is not None:
        parts.append(f"step {s.step}")
    if s.rank is not None:
        parts.append(f"rank {s.rank}")
    if s.confidence < 0.95:
        parts.append(f"confidence {s.confidence:.0%}")
    return ", ".join(parts)


def _frame(location: Location | None, report: Report, cwd: str) -> Frame | None:
    """The user's lines around a symptom: the static finding's own frame, else read from the file."""
    if location is None or not location.line:
        return None
    for f in report.findings:
        if f.path == location.path and f.line == location.line and f.cell == location.cell and f.frame:
            label = f"{f.path} (cell {f.cell})" if f.cell else f.path
            return Frame(label, f.frame["first_line"], list(f.frame["lines"]), f.line)
    path = location.path if os.path.isabs(location.path) else os.path.join(cwd, location.path)
    if not location.cell and path.endswith(".py") and os.path.isfile(path):
        first = max(1, location.line - FRAME_CONTEXT)
        lines = [linecache.getline(path, n).rstrip("\n") for n in range(first, location.line + FRAME_CONTEXT + 1)]
        while lines and not lines[-1].strip():
            lines.pop()
        if lines:
            return Frame(location.path, first, lines, location.line)
    if location.code:
        return Frame(str(location), location.line, [location.code], location.line)
    return None


# -- environment and files -----------------------------------------------------------------------


def _environment(env: dict[str, Any]) -> str:
    rows = []
    for key, value in env.items():
        if isinstance(value, dict):
            text = ", ".join(f"{k}={v}" for k, v in value.items()) or "(none)"
        elif isinstance(value, list):
            text = ", ".join(str(v) for v in value) or "(none)"
        else:
            text = "not known" if value is None else str(value)
        rows.append(f"<tr><th scope=\"row\">{escape(str(key))}</th><td>{escape(text)}</td></tr>")
    return ('<section id="environment"><h2>Environment</h2><table aria-label="environment">'
            + "".join(rows) + "</table></section>")


def _words() -> dict[str, Any]:
    """rules/data/report_html.toml: what an empty chart says, and the run directory's files."""
    from torchdoctor.rules import catalog

    return catalog.load_toml("report_html.toml")


def _files(series: RunSeries, base: str = "") -> str:
    rows = []
    for row in _words()["files"]:
        pattern = re.compile(row["pattern"])
        found = [name for name in series.files if pattern.match(name)]
        for name in found:
            href = f"{base}/{name}" if base else name
            rows.append(f'<li><a href="{escape(href)}">{escape(name)}</a> — {escape(row["what"])}</li>')
        if not found and row.get("absent"):
            rows.append(f'<li class="missing">{escape(row["absent"])}</li>')
    where = "in its run directory" if not base else "where it was written, beside the run directory"
    return ('<section id="files"><h2>Files in the run directory</h2><p class="note">Links are relative: they open '
            f"while this page sits {where}.</p><ul>" + "".join(rows) + "</ul></section>")
