"""report.html (issue 16, section 2): series from a real run directory, the SVG charts, the page.

The page is built from a real `torchdoctor run` of tests/fixtures/run/html_report.py (a leak, a NaN batch,
two parameter groups), from a real two-rank DDP run (the straggler fixture of test_run_distributed.py),
from the evidence an H100 recorded (CUDA memory), and from `check --format html`. The last test loads the
page in headless Chromium: no console errors, and the screenshot has the charts' pixels.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
import xml.etree.ElementTree as ET
import zlib
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, cli
from tests.test_run_support import assert_sound, line_of, shared_run
from torchdoctor import exitcodes
from torchdoctor.render.run_series import Series, as_number, read_run
from torchdoctor.render.svg_chart import (
    COLOURS,
    LEFT,
    MARK_COLOUR,
    RIGHT,
    TOP,
    WIDTH,
    Chart,
    Line,
    bar_chart,
    fmt,
    line_chart,
    nice_ticks,
    ranges,
    thin,
)

SVG = "{http://www.w3.org/2000/svg}"
MAX_BYTES = 3 * 1024 * 1024  # "at most a few MB"
NAN_STEP = 30  # html_report.py: batch 30 holds the NaN


# -- the chart module -------------------------------------------------------------------------------


def test_numbers_on_an_axis_are_short():
    assert [fmt(v) for v in (0, 1.28e-4, 0.0125, 12.5, 3200, 1.5e7, -0.003)] == \
        ["0", "1.28e-4", "0.0125", "12.5", "3,200", "1.5e7", "-3e-3"]


def test_ticks_are_round_and_cover_the_range():
    assert nice_ticks(0.3, 9.7) == [0, 2, 4, 6, 8, 10]
    ticks = nice_ticks(308.2, 314.1)
    assert ticks[0] <= 308.2 and ticks[-1] >= 314.1 and len(ticks) <= 8
    assert nice_ticks(5, 5) and nice_ticks(float("nan"), 1) == []


def test_thinning_keeps_a_one_step_spike_and_the_order():
    xs = list(range(100_000))
    ys = [1.0] * 100_000
    ys[77_777] = 50.0
    tx, ty = thin(xs, ys, 800)
    assert len(tx) <= 800 and max(ty) == 50.0 and tx == sorted(tx)


def test_runs_of_steps():
    assert ranges([9, 3, 4, 5, 5]) == [(3, 5), (9, 9)]


def _points(svg: ET.Element) -> list[tuple[float, float]]:
    out = []
    for poly in svg.iter(f"{SVG}polyline"):
        out += [tuple(map(float, p.split(","))) for p in poly.get("points").split()]
    return out


def test_a_line_chart_is_accessible_svg_with_every_point_inside_the_plot():
    chart = Chart("Loss per optimizer step", "loss", [Line("loss", [1, 2, 3, 4], [2.0, 1.5, 1.2, 1.1])],
                  marks=[6, 7, 8, 12])
    svg = ET.fromstring(line_chart(chart, "c1"))
    assert svg.get("role") == "img" and svg.get("aria-labelledby") == "c1-title c1-desc"
    assert svg.find(f"{SVG}title").text == "Loss per optimizer step"
    desc = svg.find(f"{SVG}desc").text
    assert "first 2, last 1.1" in desc and "not finite at 4 steps (6–8, 12)" in desc
    plot = svg.find(f"{SVG}rect[@class='plot']")
    x0, y0 = float(plot.get("x")), float(plot.get("y"))
    x1, y1 = x0 + float(plot.get("width")), y0 + float(plot.get("height"))
    points = _points(svg)
    assert len(points) == 4 and all(x0 <= x <= x1 and y0 <= y <= y1 for x, y in points)
    assert points[0][1] < points[-1][1]  # 2.0 is drawn above 1.1 (SVG's y grows downwards)
    assert len(svg.findall(f"{SVG}rect[@class='mark']")) == 2  # steps 6-8 and 12: two bands
    axis_text = [t.text for t in svg.iter(f"{SVG}text")]
    assert "optimizer step" in axis_text and "loss" in axis_text


def test_a_series_spanning_decades_is_drawn_on_a_log_scale():
    chart = Chart("norm", "gradient norm", [Line("norm", [1, 2, 3], [0.01, 1.0, 1000.0])], log_y=True)
    svg = ET.fromstring(line_chart(chart, "c2"))
    labels = [t.text for t in svg.iter(f"{SVG}text")]
    assert {"0.01", "1", "1,000"} <= set(labels) and "gradient norm (log scale)" in labels
    ys = [y for _, y in _points(svg)]
    assert (ys[0] - ys[1]) / (ys[1] - ys[2]) == pytest.approx(2 / 3, abs=0.01)  # 2 decades, then 3


def test_nothing_to_draw_is_no_chart():
    assert line_chart(Chart("t", "y", [Line("a", [], [])]), "c3") == ""
    assert bar_chart("t", [], "ms", "c4") == ""


def test_bars_are_proportional_and_the_highlighted_one_is_red():
    svg = ET.fromstring(bar_chart("own work", [("rank 0", 10.0), ("rank 1", 20.0)], "ms", "c5", {"rank 1"}))
    bars = svg.findall(f"{SVG}rect[@class='series']")
    assert float(bars[1].get("width")) == pytest.approx(2 * float(bars[0].get("width")), rel=0.01)
    assert bars[1].get("fill") == MARK_COLOUR and bars[0].get("fill") == COLOURS[0]
    assert max(float(b.get("width")) + float(b.get("x")) for b in bars) < WIDTH - RIGHT
    stacked = ET.fromstring(bar_chart("split", [("forward", 30.0), ("backward", 60.0), ("other", 10.0)], "ms", "c6",
                                      stacked=True))
    parts = stacked.findall(f"{SVG}rect[@class='series']")
    assert float(parts[0].get("x")) == LEFT and [round(float(p.get("width"))) for p in parts] == \
        [round(w * (WIDTH - LEFT - RIGHT)) for w in (0.3, 0.6, 0.1)]
    assert float(parts[0].get("y")) == TOP


def test_measured_values_read_as_numbers():
    assert [as_number(v) for v in (1, 2.5, True, "x", None)] == [1.0, 2.5, None, None, None]
    assert all(str(as_number(v)) in ("nan", "inf", "-inf") for v in ("nan", "inf", "-inf", "Infinity"))
    s = Series("loss")
    for step, value in enumerate([1.0, "nan", float("inf"), 0.5], 1):
        s.add(step, value)
    assert (s.xs, s.ys, s.nonfinite) == ([1, 4], [1.0, 0.5], [2, 3])


def test_the_pages_words_are_declared_for_every_empty_chart_and_every_linked_file():
    """rules/data/report_html.toml: a key the page asks for that the table lacks fails here, not in a user's run."""
    import torchdoctor.render.html_page as html_page
    from torchdoctor.probes import PROBES
    from torchdoctor.rules import catalog
    from torchdoctor.run_files import OUR_FILES

    words = catalog.load_toml("report_html.toml")
    asked = set(re.findall(r'figures\.missing\("[^"]+", "([a-z_]+)"\)', Path(html_page.__file__).read_text()))
    assert asked and asked == set(words["not_measured"])
    assert all(row["probe"] in PROBES for row in words["not_measured"].values() if row["probe"])
    for row in words["files"]:
        example = re.sub(r"\\d\+", "0", row["pattern"].strip("^$")).replace("\\", "")
        assert re.match(row["pattern"], example) and OUR_FILES.match(example), row  # a file a run writes


# -- a real run ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return shared_run(tmp_path_factory, "html-report", "html_report.py")


class _Tags(HTMLParser):
    """Every start tag with its attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str]]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, {k: v or "" for k, v in attrs}))


def _self_contained(text: str, run_dir: Path | None) -> list[str]:
    """What in a page would fetch something or break offline: none of it may be there."""
    problems = []
    parser = _Tags()
    parser.feed(text)
    for tag, attrs in parser.tags:
        if tag in ("script", "iframe", "object", "embed", "img", "link", "source", "video", "audio"):
            problems.append(f"<{tag}> {attrs}")
        for name in ("src", "href", "xlink:href", "action", "data", "poster"):
            value = attrs.get(name)
            if value is None:
                continue
            if re.match(r"^\s*([a-z][a-z0-9+.-]*:|//)", value, re.I):
                problems.append(f"{tag} {name}={value}")  # http(s):, file:, data:, javascript:, //host
            elif value.startswith("#"):
                if f'id="{value[1:]}"' not in text:
                    problems.append(f"{tag} {name}={value}: no such anchor")
            elif run_dir is None or not (run_dir / value).is_file():
                problems.append(f"{tag} {name}={value}: no such file beside the page")
    if re.search(r"url\(|@import", text):
        problems.append("CSS that loads something")
    return problems


def test_series_from_a_real_run(run):
    s = read_run(run.run_dir)
    steps = run.run["steps_completed"]
    assert steps == 40
    assert s.loss.xs == list(range(1, NAN_STEP)) and s.loss.nonfinite == list(range(NAN_STEP, steps + 1))
    assert s.grad_norm.nonfinite[0] == NAN_STEP and all(v > 0 for v in s.grad_norm.ys)
    assert len(s.rss.xs) >= steps // 2 and all(200 < v < 5000 for v in s.rss.ys)
    assert not s.cuda_allocated  # a CPU run: no CUDA series
    assert s.step_ms.xs[0] == 2 and len(s.step_ms.xs) == steps - 1 and min(s.step_ms.ys) > 0
    assert len(s.data_wait.xs) == steps
    assert [g.name for g in s.lr] == ["group 0", "group 1"]
    head, body = s.lr[1].ys, s.lr[0].ys
    assert max(head) == pytest.approx(10 * max(body), rel=0.05)  # max_lr=[0.01, 0.1]: each group its own curve
    assert s.split is not None and (s.split.from_step, s.split.to_step) == (6, 10)
    assert [name for name, _ in s.split.parts] == ["data", "forward", "backward", "optimizer", "other"]
    nodes = s.holders["total_loss"]["graph_nodes"]
    assert len(nodes.xs) >= 5 and nodes.ys[-1] > 3 * nodes.ys[0]  # the leak: its graph keeps growing
    assert "trace.rank0.json" in s.files and "report.json" in s.files


def test_report_html_is_written_self_contained_and_small(run, validate_report):
    assert_sound(run, validate_report, exitcodes.FINDINGS)
    run_dir = Path(run.run_dir)
    page = run_dir / "report.html"
    text = page.read_text(encoding="utf-8")
    assert page.stat().st_size < MAX_BYTES
    assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")
    assert _self_contained(text, run_dir) == []
    assert run.report["artifacts"]["report_html"].endswith("report.html")
    manifest = json.loads((run_dir / ".torchdoctor-run.json").read_text())
    assert "report.html" in manifest["files"]  # the next run into this --out may replace it
    assert '<a href="trace.rank0.json">' in text and "ui.perfetto.dev" in text  # a link text, not a fetch


def test_the_page_draws_what_was_measured(run):
    text = (Path(run.run_dir) / "report.html").read_text(encoding="utf-8")
    svgs = [ET.fromstring(m) for m in re.findall(r"<svg .*?</svg>", text, re.S)]
    titles = [svg.find(f"{SVG}title").text for svg in svgs]
    assert titles[:6] == ["Loss per optimizer step", "Total gradient norm per optimizer step",
                          "RSS (process memory) per optimizer step",
                          "autograd graph nodes held by total_loss, per memory scan", "Time per optimizer step",
                          "Where a step's time goes (steps 6–10)"]
    assert titles[6:] == ["Time each optimizer step waited for its batches", "Learning rate per optimizer step"]
    ids = [e.get("id") for svg in svgs for e in svg.iter() if e.get("id")]
    assert len(ids) == len(set(ids))  # every title/description id unique in the page
    loss = svgs[0]
    assert "not finite at 11 steps (30–40)" in loss.find(f"{SVG}desc").text
    assert len(loss.findall(f"{SVG}rect[@class='mark']")) == 1
    assert len(_points(loss)) == NAN_STEP - 1
    assert all(_points(svg) or svg.findall(f"{SVG}rect[@class='series']") for svg in svgs)  # none drawn empty
    lr = svgs[-1].find(f"{SVG}desc").text
    assert "measured, group 0" in lr and "measured, group 1" in lr
    line = line_of("html_report.py", "    total_loss += loss")
    assert f"What holds the leak: `total_loss` (html_report.py:{line})" in text
    assert "CUDA memory: not measured — CUDA was not used by the script." in text
    # RSS barely moves while the graph grows: the page says where the leak is, never that there is none
    assert "the leak was found in what a variable holds (below), not in this series" in text
    assert "no memory growth was found" not in text


def test_a_card_per_symptom_with_its_code_frame_evidence_and_fixes(run):
    text = (Path(run.run_dir) / "report.html").read_text(encoding="utf-8")
    cards = re.findall(r'<article class="card" id="([^"]+)">(.*?)</article>', text, re.S)
    assert [anchor.split("-", 2)[2] for anchor, _ in cards] == [s["id"] for s in run.report["symptoms"]]
    leak = dict(cards)[cards[0][0]]
    line = line_of("html_report.py", "    total_loss += loss")
    assert re.search(rf"<b>&gt; {line} \|\s+total_loss \+= loss</b>", leak)  # the frame, the line marked
    assert "measured: `total_loss` holds an autograd graph" in leak.replace("&#x27;", "'")
    assert "Fix 1:" in leak and "Verify:" in leak
    for anchor, _ in cards:
        assert f'href="#{anchor}"' in text  # the symptom table links to each card


def test_a_growing_rss_gets_the_leak_slope_drawn_over_it_and_the_holder_named(tmp_path_factory):
    growing = shared_run(tmp_path_factory, "growing", "growing_list.py")  # shared with test_run_memory.py
    [growth] = [s for s in growing.report["symptoms"] if s["id"] == "memory-growth"]
    byte = next(ev["values"] for ev in growth["evidence"] if "slope_mib_per_step" in ev["values"])
    text = (Path(growing.run_dir) / "report.html").read_text(encoding="utf-8")
    svgs = [ET.fromstring(m) for m in re.findall(r"<svg .*?</svg>", text, re.S)]
    [rss] = [svg for svg in svgs if svg.find(f"{SVG}title").text == "RSS (process memory) per optimizer step"]
    data, fit = rss.findall(f"{SVG}polyline")
    assert fit.get("stroke-dasharray") and f"leak: {byte['slope_mib_per_step']:+.3g} MiB per step" in \
        rss.find(f"{SVG}desc").text
    start, end = [tuple(map(float, p.split(","))) for p in fit.get("points").split()]
    points = [tuple(map(float, p.split(","))) for p in data.get("points").split()]
    near_end = min(points, key=lambda p: abs(p[0] - end[0]))
    assert end[1] < start[1] and abs(near_end[1] - end[1]) < 10  # rising, and on the data where it ends
    assert "What holds the leak: `history`" in text


def test_a_crashed_run_names_its_exception_at_the_top(tmp_path_factory):
    raises = shared_run(tmp_path_factory, "raises", "raises.py")  # shared with test_run_faults.py
    text = (Path(raises.run_dir) / "report.html").read_text(encoding="utf-8")
    top = text[:text.index('<section id="charts">')]
    assert "The script crashed" in top and "RuntimeError: mat1 and mat2 shapes cannot be multiplied" in top
    assert f"at raises.py:{line_of('raises.py', 'return model(batch)')}" in top


@pytest.mark.parametrize("name", ["leak", "healthy"])
def test_cuda_memory_from_the_h100_evidence(name, tmp_path):
    """The CUDA charts, from what an H100 recorded (tests/data/gpu_h100): allocated and reserved per step."""
    from tests.test_run_gpu_recorded import DATA
    from torchdoctor.model import Report, RunInfo
    from torchdoctor.render.html_page import page

    run_dir = tmp_path / name
    shutil.copytree(DATA / name, run_dir)
    (run_dir / "memory_snapshot.rank0.pickle").write_bytes(b"")  # the CUDA snapshot the memory probe dumps
    recorded = json.loads((run_dir / "report.json").read_text())
    info = RunInfo(exit_code=0, steps_completed=recorded["run"]["steps_completed"], stopped="completed",
                   duration_s=1.0, probes=recorded["run"]["probes"])
    text = page(Report(command="run", target=f"{name}.py", run=info), run_dir)
    svgs = {svg.find(f"{SVG}title").text: svg for svg in map(ET.fromstring, re.findall(r"<svg .*?</svg>", text, re.S))}
    cuda = svgs["CUDA memory per optimizer step"]
    desc = cuda.find(f"{SVG}desc").text
    assert "CUDA allocated:" in desc and "CUDA reserved:" in desc
    assert len(cuda.findall(f"{SVG}polyline")) == 2
    assert "Loss: not measured — no step recorded a loss" in text  # the nan probe ran, these steps have none
    assert _self_contained(text, run_dir) == []
    assert '<a href="memory_snapshot.rank0.pickle">' in text and "drag it onto pytorch.org/memory_viz" in text
    assert "CUDA memory snapshot: not recorded" not in text


def test_the_learning_rate_goes_on_after_the_gradient_checks_stop_recording(tmp_path):
    """The nan probe's grad-norms events stop after its event budget; the scheduler's record covers the run."""
    with open(tmp_path / "events.rank0.jsonl", "w") as fh:
        for step in range(1, 201):
            fh.write(json.dumps({"kind": "grad-norms", "probe": "nan", "step": step, "at_step": step, "t": step,
                                 "total": 1.0, "lr": 0.1, "group_lrs": [0.1, 0.01]}) + "\n")
        fh.write(json.dumps({"kind": "scheduler-end", "probe": "schedule", "step": 1000, "t": 1000.0,
                             "lrs": [[s, 0.1 * 0.99 ** (s // 100)] for s in range(100, 1001, 100)]}) + "\n")
    lr = read_run(tmp_path).lr
    assert [s.name for s in lr] == ["group 0", "group 1", "group 0 (after each scheduler.step())"]
    assert lr[0].xs[-1] == 200 and lr[2].xs[-1] == 1000
    (tmp_path / "events.rank0.jsonl").write_text(json.dumps(
        {"kind": "scheduler-end", "probe": "schedule", "step": 10, "t": 1.0, "lrs": [[5, 0.1], [10, 0.05]]}) + "\n")
    assert [s.name for s in read_run(tmp_path).lr] == ["group 0 (after each scheduler.step())"]


def test_text_from_the_run_is_escaped_everywhere(tmp_path):
    """A note, an environment value, a symptom's evidence and a holder's name come from the user's run: none of
    them may become markup."""
    from torchdoctor.model import Evidence, Report, RunInfo
    from torchdoctor.render.html_page import page
    from torchdoctor.rules import catalog

    evil = "<script>alert(1)</script><img src=x onerror=alert(2)>"
    with open(tmp_path / "steps.rank0.jsonl", "w") as fh:
        for step in range(1, 21):
            fh.write(json.dumps({"kind": "step", "step": step, "t": step * 0.1, "memory": {"rss_mib": 300 + step}})
                     + "\n")
    with open(tmp_path / "events.rank0.jsonl", "w") as fh:
        for step in (5, 10, 15, 20):
            fh.write(json.dumps({"kind": "holders", "probe": "memory", "step": step, "t": step * 0.1,
                                 "holders": [{"name": evil, "kind": "list", "tensors": step, "mib": 0.1}]}) + "\n")
    growth = catalog.make_symptom("memory-growth", evidence=[
        Evidence(kind="probe", summary=evil, values={"variable": evil, "tensors_growth_per_step": 1.0})])
    info = RunInfo(exit_code=0, steps_completed=20, stopped="completed", duration_s=2.0, probes=["memory"])
    report = Report(command="run", target=evil, run=info, symptoms=[growth], notes=[evil],
                    environment={"variables": {"X": evil}, "torch": evil})
    text = page(report, tmp_path)
    assert _self_contained(text, tmp_path) == [] and "<script" not in text and "<img" not in text
    assert text.count("&lt;script&gt;") >= 5 and "What holds the leak: `&lt;script&gt;" in text
    for svg in re.findall(r"<svg .*?</svg>", text, re.S):
        ET.fromstring(svg)  # still well-formed XML with the name inside


def test_a_long_run_stays_small(tmp_path):
    """100,000 steps of every per-step number: the page thins each line and stays under the bound."""
    from torchdoctor.model import Report, RunInfo
    from torchdoctor.render.html_page import page

    with open(tmp_path / "steps.rank0.jsonl", "w") as fh:
        for step in range(1, 100_001):
            fh.write(json.dumps({"kind": "step", "step": step, "t": step * 0.01,
                                 "memory": {"rss_mib": 300 + step * 1e-3}, "data": {"wait_ms": 0.2},
                                 "nan": {"loss": "nan" if step % 997 == 0 else 1 / step, "grad_norm": 1.0}}) + "\n")
    info = RunInfo(exit_code=0, steps_completed=100_000, stopped="completed", duration_s=1000.0,
                   probes=["memory", "nan", "data"])
    text = page(Report(command="run", target="long.py", run=info), tmp_path)
    assert len(text.encode()) < 1024 * 1024
    assert "not finite at 100 steps" in text


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.heavy  # a 2-rank torchrun (~6 s); the quick suite was at 603 s on a clean clone of stop 26 (budget 600)
def test_ddp_ranks_timeline_and_straggler(tmp_path_factory):
    from tests.test_run_distributed import dist_run

    mistakes = dist_run(tmp_path_factory, "mistakes", "-p", "distributed", "--", "torchrun", "--standalone",
                        "--nproc_per_node", "2", "ddp_mistakes.py", "{scratch}")
    [straggler] = [s for s in mistakes.report["symptoms"] if s["id"] == "straggler"]
    text = (Path(mistakes.run_dir) / "report.html").read_text(encoding="utf-8")
    svgs = {svg.find(f"{SVG}title").text: svg for svg in map(ET.fromstring, re.findall(r"<svg .*?</svg>", text, re.S))}
    timeline = svgs["Time per optimizer step, per rank"]
    assert len(timeline.findall(f"{SVG}polyline")) == 2
    own = svgs["Own work per step, per rank (median)"]
    red = [r for r in own.findall(f"{SVG}rect[@class='series']") if r.get("fill") == MARK_COLOUR]
    assert len(red) == 1 and f"Straggler (in red): rank {straggler['rank']}." in text
    assert "Memory: not measured — the memory probe did not run (`--probe memory` adds it)." in text
    assert _self_contained(text, Path(mistakes.run_dir)) == []


def test_a_sixteen_rank_timeline_draws_the_fastest_median_slowest_and_the_straggler(tmp_path):
    from torchdoctor.model import Report, RunInfo
    from torchdoctor.render.html_page import page
    from torchdoctor.rules import catalog

    for rank in range(16):
        ms = 10.0 + rank + (30.0 if rank == 5 else 0.0)  # rank 5 is the slowest
        with open(tmp_path / f"steps.rank{rank}.jsonl", "w") as fh:
            for step in range(1, 21):
                fh.write(json.dumps({"kind": "step", "step": step, "t": step * ms / 1e3}) + "\n")
    straggler = catalog.make_symptom("straggler", rank=3)
    info = RunInfo(exit_code=0, steps_completed=20, stopped="completed", duration_s=1.0, ranks=16, probes=[])
    text = page(Report(command="run", target="ddp.py", run=info, symptoms=[straggler]), tmp_path)
    svgs = {svg.find(f"{SVG}title").text: svg for svg in map(ET.fromstring, re.findall(r"<svg .*?</svg>", text, re.S))}
    desc = svgs["Time per optimizer step, per rank"].find(f"{SVG}desc").text
    drawn = sorted(int(n) for n in re.findall(r"rank (\d+):", desc))
    assert drawn == [0, 3, 5, 9]  # fastest, the straggler, slowest, median (sorted by speed: index 8 is rank 9)
    assert "4 of 16 ranks drawn" in text


# -- check --format html --------------------------------------------------------------------------------


def test_check_format_html_is_the_static_page():
    script = FIXTURES / "check" / "rules" / "TD101" / "fire.py"
    proc = cli("check", "--format", "html", str(script))
    assert proc.returncode == exitcodes.FINDINGS, proc.stderr_text
    text = proc.stdout_text
    assert text.startswith("<!DOCTYPE html>") and "Nothing was run" in text
    assert '<article class="card"' in text and "Static findings" in text and "&gt; " in text  # a marked frame
    assert _self_contained(text, None) == []
    assert cli("check", "--format", "htm", str(script)).returncode == exitcodes.USAGE


# -- in a browser -------------------------------------------------------------------------------------------


def _png_pixels(data: bytes) -> tuple[int, int, list[bytes]]:
    """Width, height and RGB rows of an 8-bit, non-interlaced PNG (what Chromium writes): enough to count colours."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and colour in (2, 6) and interlace == 0
            channels = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * channels
    rows, prev = [], bytearray(stride)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b, c = prev[i], prev[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + a) & 255
            elif kind == 2:
                line[i] = (line[i] + b) & 255
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line[i] for i in range(stride) if i % channels < 3))
        prev = line
    return width, height, rows


def _count(rows: list[bytes], colour: str, tolerance: int = 16) -> int:
    r, g, b = (int(colour[i:i + 2], 16) for i in (1, 3, 5))
    return sum(1 for row in rows for i in range(0, len(row), 3)
               if abs(row[i] - r) < tolerance and abs(row[i + 1] - g) < tolerance and abs(row[i + 2] - b) < tolerance)


def _browser() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def _load(browser: str, page: Path, shot: Path) -> list[str]:
    """Load a page headless, screenshot it; the console lines it logged."""
    proc = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--enable-logging=stderr", "--v=0", "--window-size=1000,2600", f"--screenshot={shot}",
                           page.resolve().as_uri()], capture_output=True, text=True, timeout=120)
    assert shot.is_file(), proc.stderr[-2000:]
    return [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]


@pytest.mark.slow
@pytest.mark.skipif(_browser() is None, reason="no Chromium here (Debian: apt-get install chromium)")
@pytest.mark.heavy  # starts a browser
def test_the_page_opens_in_chromium_without_console_errors_and_draws_its_charts(run, tmp_path):
    browser = _browser()
    page = Path(run.run_dir) / "report.html"
    console = _load(browser, page, tmp_path / "report.png")
    assert console == []
    _, height, rows = _png_pixels((tmp_path / "report.png").read_bytes())
    assert height == 2600
    drawn, marked = _count(rows, COLOURS[0]), _count(rows, MARK_COLOUR)
    assert drawn > 1500 and marked > 500, (drawn, marked)  # the series lines and the non-finite bands

    # The checks can fail: the same page without its charts has none of their pixels, and a page that logs an
    # error to the console is caught.
    blank = tmp_path / "no-charts.html"
    blank.write_text(re.sub(r"<figure>.*?</figure>", "", page.read_text(encoding="utf-8"), flags=re.S),
                     encoding="utf-8")
    _load(browser, blank, tmp_path / "blank.png")
    _, _, rows = _png_pixels((tmp_path / "blank.png").read_bytes())
    assert _count(rows, COLOURS[0]) < drawn / 20
    noisy = tmp_path / "noisy.html"
    noisy.write_text("<!DOCTYPE html><p>x</p><script>console.error('planted')</script>", encoding="utf-8")
    assert any("planted" in line for line in _load(browser, noisy, tmp_path / "noisy.png"))
