"""Classify the compile probe's evidence: graph breaks by site, recompilations by function.

Reads the events of probes/compile.py (dynamo's own log records, parsed in
the script's process); thresholds in rules/data/thresholds.toml, [compile].
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from torchdoctor.analysis import Analysis
from torchdoctor.analysis.evidence import RunEvidence
from torchdoctor.model import Evidence
from torchdoctor.probes.userframes import display_path

PROBE = "compile"


def analyse(run: RunEvidence) -> Analysis:
    out = Analysis()
    lim = run.limits(PROBE)
    for rank in run.ranks:
        _graph_breaks(run, rank, lim, out)
        _recompiles(run, rank, lim, out)
    summaries = run.of_kind("compile-summary", PROBE)
    if any(s.get("compile_calls") or s.get("unique_graphs") for s in summaries):
        out.contexts.append("compile")
    replaced = sorted({b for s in summaries for b in s.get("backends_replaced") or []})
    forced = next((s.get("backend_forced") for s in summaries if s.get("backend_forced")), None)
    if forced and replaced:
        out.notes.append(
            f"torch.compile ran with backend {forced!r} instead of {', '.join(replaced)} (--compile-backend): graph "
            "breaks and recompiles come from dynamo's tracing and are the same; step times are not."
        )
    out.measurements = _measurements(run)
    return out


def _sites(run: RunEvidence, rank: int) -> OrderedDict[tuple[str, int, str], list[dict[str, Any]]]:
    sites: OrderedDict[tuple[str, int, str], list[dict[str, Any]]] = OrderedDict()
    for e in run.of_kind("graph-break", PROBE, rank):
        key = (e.get("path") or "?", int(e.get("line") or 0), e.get("reason") or "")
        sites.setdefault(key, []).append(e)
    return sites


def _graph_breaks(run: RunEvidence, rank: int, lim: dict[str, Any], out: Analysis) -> None:
    sites = _sites(run, rank)
    if len(sites) < int(lim.get("min_graph_breaks", 1)):
        return
    evidence: list[Evidence] = []
    for (path, line, reason), events in sites.items():
        first = events[0]
        location = run.location(path, line or None, first.get("function")) if path != "?" else None
        values: dict[str, Any] = {"reason": reason, "file": display_path(path, run.cwd), "line": line,
                                  "occurrences": len(events)}
        if first.get("explanation"):
            values["explanation"] = first["explanation"]
        code = f": `{location.code}`" if location is not None and location.code else ""
        evidence.append(Evidence(
            kind="probe", source=PROBE, location=location, values=values,
            summary=f"graph break at {location or path}{code} — {reason}",
        ))
    head = evidence[0]
    values = dict(head.values)
    values.update(graph_breaks=len(sites), graph_break_events=sum(len(v) for v in sites.values()),
                  sites=[f"{e.values['file']}:{e.values['line']} {e.values['reason']}" for e in evidence])
    summary = f"torch.compile broke the graph at {len(sites)} place(s); first at " + head.summary.split(" at ", 1)[1]
    out.symptoms.append(run.symptom("graph-break", probe=PROBE, summary=summary, values=values,
                                    location=head.location, rank=rank, evidence=evidence[1:]))


def _recompiles(run: RunEvidence, rank: int, lim: dict[str, Any], out: Analysis) -> None:
    functions: OrderedDict[tuple[str, str, int], dict[str, Any]] = OrderedDict()
    for e in run.of_kind("recompile", PROBE, rank):
        key = (e.get("function") or "?", e.get("path") or "?", int(e.get("line") or 0))
        entry = functions.setdefault(key, {"count": 0, "events": [], "limit": None})
        entry["count"] += 1
        entry["events"].append(e)
    for e in run.of_kind("recompile-limit", PROBE, rank):
        key = (e.get("function") or "?", e.get("path") or "?", int(e.get("line") or 0))
        functions.setdefault(key, {"count": 0, "events": [], "limit": None})["limit"] = e
    minimum = int(lim.get("min_recompiles", 2))
    for (function, path, line), entry in functions.items():
        if entry["count"] < minimum and entry["limit"] is None:
            continue
        last = entry["events"][-1] if entry["events"] else {}
        limit = entry["limit"]
        guard = last.get("guard") or (limit or {}).get("last_reason")
        location = run.location(path, line or None, function) if path != "?" else None
        values: dict[str, Any] = {"recompiles": entry["count"], "function": function, "guard": guard,
                                  "file": display_path(path, run.cwd), "line": line}
        if entry["events"] and entry["events"][0].get("guard"):
            values["first_guard"] = entry["events"][0]["guard"]
        if limit is not None:
            values.update(limit=limit.get("limit"), limit_kind=limit.get("limit_kind"),
                          last_reason=limit.get("last_reason"))
        summary = f"`{function}` ({display_path(path, run.cwd)}:{line}) was recompiled {entry['count']} time(s)"
        if limit is not None:
            summary += f" and hit {limit.get('limit_kind')} ({limit.get('limit')}): dynamo runs it eagerly from then on"
        if guard:
            summary += f"; the failing guard: {guard}"
        out.symptoms.append(run.symptom("recompile", probe=PROBE, summary=summary,
                                        values={k: v for k, v in values.items() if v is not None},
                                        location=location, rank=rank))


def _measurements(run: RunEvidence) -> dict[str, Any]:
    rank = run.ranks[0]
    summaries = run.of_kind("compile-summary", PROBE, rank)
    s = summaries[-1] if summaries else {}
    m: dict[str, Any] = {
        "compile_calls": s.get("compile_calls", 0),
        "graph_break_sites": len(_sites(run, rank)),
        "recompiles": len(run.of_kind("recompile", PROBE, rank)),
    }
    for key in ("unique_graphs", "graph_break_count", "backend_forced"):
        if s.get(key) is not None:
            m[key] = s[key]
    if not m["compile_calls"] and not s.get("unique_graphs"):
        m["summary"] = "torch.compile was not used"
    else:
        m["summary"] = (f"torch.compile called {m['compile_calls']} time(s); {s.get('unique_graphs', 0)} graphs, "
                        f"{m['graph_break_sites']} graph-break site(s), {m['recompiles']} recompile(s)")
    return m
