"""`torchdoctor check`: static rules over files -> findings -> symptoms -> the shared pipeline.

    paths -> sources (walk, .gitignore, exclude) -> engine (one parse + one walk per file,
    in worker processes for large trees) -> Findings -> Symptoms with static evidence ->
    diagnose (merge, route, specialists) -> render -> exit code

Nothing here imports torch or rich; rich is imported by the text renderer only
when it writes to a terminal.
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from torchdoctor import exitcodes
from torchdoctor.config import ConfigError, Settings, check_fail_on, load
from torchdoctor.model import SEVERITY_RANK, Evidence, Finding, Location, Report, Symptom

if TYPE_CHECKING:
    from torchdoctor.rules.static.engine import Result

PARALLEL_MIN_FILES = 48  # below this, starting worker processes costs more than it saves
FORMATS = ("text", "json", "sarif", "github", "markdown", "html")


class UsageError(Exception):
    """A bad option, path or config: one line on stderr, exit 2."""


@dataclass
class CheckRequest:
    paths: list[str] = field(default_factory=lambda: ["."])
    fmt: str = "text"
    select: list[str] | None = None
    ignore: list[str] = field(default_factory=list)
    fail_on: str | None = None
    statistics: bool = False
    config: str | None = None
    jobs: int | None = None
    stdin_filename: str | None = None
    details: bool = False  # text: the full report after the summary


def split_codes(values: Iterable[str] | None) -> list[str]:
    """`--select TD1,TD2 --select TD301` -> ["TD1", "TD2", "TD301"]."""
    out: list[str] = []
    for value in values or ():
        out += [v.strip() for v in value.split(",") if v.strip()]
    return out


# -- discovery --------------------------------------------------------------------------------


def discover(paths: Sequence[str], settings: Settings) -> list[tuple[str, str]]:
    """(path to read, path to show) for every source under the given paths, in order, once each."""
    from torchdoctor.rules.static.gitignore import IgnoreFile
    from torchdoctor.rules.static.sources import default_excludes, is_test_path, test_excludes, walk

    root = os.path.abspath(settings.root).replace(os.sep, "/")
    excludes = [default_excludes(), IgnoreFile(root, settings.exclude)]
    tests = [] if settings.include_tests else [test_excludes()]
    seen: set[str] = set()
    found: list[tuple[str, str]] = []
    for given in paths:
        if given == "-":
            continue
        if os.path.isdir(given):
            # A tests folder the user names is checked: the test excludes apply below other folders.
            chosen = excludes if is_test_path(given) else [*excludes, *tests]
            candidates: Iterable[str] = walk(given, chosen, settings.respect_gitignore)
        else:
            candidates = [given]
        for path in candidates:
            key = os.path.realpath(path)
            if key not in seen:
                seen.add(key)
                found.append((path, _display(path)))
    return found


def _display(path: str) -> str:
    path = os.path.normpath(path) if not path.startswith("./") else path[2:]
    return path.replace(os.sep, "/")


# -- analysis ---------------------------------------------------------------------------------


def default_jobs() -> int:
    try:
        cores = len(os.sched_getaffinity(0))  # type: ignore[attr-defined]
    except AttributeError:
        cores = os.cpu_count() or 1
    return max(1, min(cores, 8))


def sequential(items: Sequence[tuple[str, str]], jobs: int | None) -> bool:
    """Whether `analyse` runs in this process (one job, or too few files to pay for workers)."""
    jobs = default_jobs() if jobs is None or jobs <= 0 else jobs
    return jobs == 1 or len(items) < PARALLEL_MIN_FILES


def analyse(items: Sequence[tuple[str, str]], options, jobs: int | None,
            sources: dict[str, bytes] | None = None) -> Iterator:
    """FileResults in the order of `items`; across worker processes when there are many files. `sources`: bytes
    the pre-pass read (by path), handed on and let go file by file when the analysis runs in this process."""
    from torchdoctor.rules.static.engine import analyse_batch, analyse_file

    if sequential(items, jobs):
        for path, display in items:
            yield analyse_file(path, display, options, sources.pop(path, None) if sources else None)
        return
    jobs = default_jobs() if jobs is None or jobs <= 0 else jobs
    from concurrent.futures import ProcessPoolExecutor

    size = max(4, min(64, len(items) // (jobs * 8) or 1))
    chunks = [items[i : i + size] for i in range(0, len(items), size)]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        for batch in pool.map(analyse_batch, chunks, [options] * len(chunks)):
            yield from batch


# -- report -----------------------------------------------------------------------------------


def _per_file_ignored(settings: Settings) -> list[tuple[object, list[str]]]:
    from torchdoctor.rules.static.gitignore import IgnoreFile

    return [(IgnoreFile("", [pattern]), [c.upper() for c in codes]) for pattern, codes in settings.per_file_ignores.items()]


def _relative(path: str, root: str) -> str:
    absolute = os.path.abspath(path)
    try:
        rel = os.path.relpath(absolute, root)
    except ValueError:
        return path.replace(os.sep, "/")
    return (absolute if rel.startswith("..") else rel).replace(os.sep, "/")


def _dropped(finding: Finding, rules: list[tuple[object, list[str]]], root: str) -> bool:
    from torchdoctor.rules.static.gitignore import matches_path_or_parent

    if not rules:
        return False
    rel = _relative(finding.path, root)
    for pattern, codes in rules:
        if any(finding.code.startswith(c) for c in codes) and matches_path_or_parent(pattern, rel):  # type: ignore[arg-type]
            return True
    return False


def symptom_of(result: Result) -> Symptom:
    """A finding as a Symptom with static evidence (make_symptom fills title and route)."""
    from torchdoctor.rules.catalog import make_symptom

    f: Finding = result.finding
    location = Location(f.path, f.line, f.col, f.end_line, result.function, result.code or None, cell=f.cell)
    evidence = Evidence(
        kind="static",
        summary=f"{f.message} [{f.code}]",  # a notebook's cell is in the location
        quote=result.code or None,
        values={**result.values, "rule": f.name},
        source=f.code,
        location=location,
    )
    return make_symptom(f.symptom, severity=f.severity, location=location, evidence=[evidence])


def level_for(result: Result, levels: dict[str, str]) -> str:
    """The finding's severity under the config's `severity` table: the most specific matching selector decides,
    as for select/ignore. The table sets the rule's level, raising a calibrated rule back or lowering one; a finding
    the rule itself reported below its own level (a milder shape of the problem) is never raised above what it
    reported, and a rule's own bug (TD000) keeps its level."""
    finding = result.finding
    if not levels or finding.code == "TD000":
        return finding.severity
    from torchdoctor.rules.static import registry
    from torchdoctor.rules.static.api import milder

    matches = [p for p in levels if finding.code.startswith(registry.normalise_selector(p))]
    if not matches:
        return finding.severity
    level = levels[max(matches, key=lambda p: len(registry.normalise_selector(p)))]
    rule = registry.rules().get(finding.code)
    if rule is not None and result.reported and result.reported != rule.doc.severity:
        return milder(level, result.reported)
    return level


def build_report(request: CheckRequest, settings: Settings, stdin: bytes | None = None) -> Report:
    from torchdoctor.rules.static import registry
    from torchdoctor.rules.static.engine import Options, analyse_bytes

    started = time.perf_counter()
    codes = tuple(r.code for r in registry.selected(settings.select, settings.ignore))
    options = Options(codes=codes, torch_version=settings.torch_version, max_bytes=settings.max_file_bytes)
    items = discover(request.paths, settings)
    # In one process the pre-pass's reads are kept for the analysis: each file is read once. Worker processes
    # read their own files (the bytes would cost more to send them than to read again).
    sources: dict[str, bytes] | None = {} if sequential(items, request.jobs) else None
    options.project = project_classes(items, _roots(request.paths), options.max_bytes, sources)
    results = []
    files = 0
    not_analysed = 0
    contexts: set[str] = set()
    if "-" in request.paths:
        name = request.stdin_filename or "-"
        results_stdin = analyse_bytes(stdin or b"", name, options)
        files += 1
        not_analysed += not results_stdin.analysed
        contexts |= results_stdin.contexts
        results += results_stdin.results
    analysed = []
    for file_result in analyse(items, options, request.jobs, sources):
        files += 1
        not_analysed += not file_result.analysed
        contexts |= file_result.contexts
        results += file_result.results
        analysed.append(file_result)
    results += _project_pass(request, analysed, options)
    root = os.path.abspath(settings.root)
    pfi = _per_file_ignored(settings)
    results = [r for r in results if r.finding.code in codes and not _dropped(r.finding, pfi, root)]
    for r in results:
        r.finding.severity = level_for(r, settings.severity)
    results.sort(key=lambda r: (r.finding.path, r.finding.cell or 0, r.finding.line, r.finding.col, r.finding.code))

    report = Report(
        command="check",
        target=" ".join(request.paths),
        findings=[r.finding for r in results],
        symptoms=[symptom_of(r) for r in results if r.finding.code != "TD000"],
        contexts=sorted(contexts),
    )
    report.environment = {
        "torch_version": ".".join(map(str, settings.torch_version)) if settings.torch_version else None,
        "torch_version_source": settings.torch_version_source,
        "config": settings.config_path,
        "rules": len(codes),
    }
    report.notes.append(_summary(files, not_analysed, report.findings))
    report.timings["analyse_s"] = round(time.perf_counter() - started, 3)
    return report


def _roots(paths: Sequence[str]) -> list[str]:
    """The folders module names are taken below: the folders named, else the named files' folders."""
    return [p for p in paths if p != "-" and os.path.isdir(p)] or [
        os.path.dirname(os.path.abspath(p)) for p in paths if p != "-"]


def project_classes(items: Sequence[tuple[str, str]], roots: list[str], max_bytes: int,
                    sources: dict[str, bytes] | None = None):
    """The pre-pass: which classes of the checked `.py` files are torch modules (semantic/projectclasses.py), so a
    file's index knows a model class another file defines, and what callers in other files hand to each function's
    parameters (semantic/projectcalls.py). Only class headers are read; a file that cannot be
    read is left to the analysis, which reports it. `sources`, when given, keeps each file's bytes by path for the
    analysis (engine.analyse_file), so that no file is read twice."""
    from torchdoctor.rules.static.project import module_namer
    from torchdoctor.rules.static.semantic.projectclasses import build
    from torchdoctor.rules.static.sources import UnreadableSource, read_source

    module_name = module_namer(roots)
    texts: list[tuple[str, str]] = []
    paths: dict[str, str] = {}  # display path (as the engine names the file) -> module
    for path, display in items:
        if not path.endswith(".py"):
            continue
        try:  # a pipe or a device would block or never end: the analysis reports it, as a file too large
            data = read_source(path, path, max_bytes)
        except UnreadableSource:
            continue
        if sources is not None:
            sources[path] = data
        module = module_name(path)
        texts.append((module, _text(data)))
        paths[display] = module
    return build(texts, paths) if len(texts) > 1 else None


def _text(data: bytes) -> str:
    """The text the pre-pass reads: UTF-8 with undecodable bytes replaced and every line ending made `\\n`, as a
    file opened in text mode reads (its patterns look for the newline before a line)."""
    text = data.decode("utf-8", errors="replace")
    return text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text


def _project_pass(request: CheckRequest, analysed: list, options) -> list:
    """The rules that join files (rules/static/project.py): their findings, as the engine writes findings."""
    from torchdoctor.rules.static.engine import project_findings

    return project_findings({}, analysed, options.codes, _roots(request.paths))


def _summary(files: int, not_analysed: int, findings: list[Finding]) -> str:
    if files == 0:
        return "No Python files or notebooks found under the given paths."
    counts = Counter(f.severity for f in findings)
    parts = [f"{counts[s]} {s}{'s' if counts[s] != 1 and s != 'info' else ''}" for s in ("error", "warning", "info") if counts[s]]
    text = f"Checked {files} file{'s' if files != 1 else ''}"
    if not_analysed:
        text += f" ({not_analysed} could not be analysed)"
    text += ": " + (", ".join(parts) if parts else "no findings") + "."
    return text


def exit_code(findings: Iterable[Finding], fail_on: str) -> int:
    if fail_on == "never":
        return exitcodes.OK
    threshold = SEVERITY_RANK[fail_on]
    return exitcodes.FINDINGS if any(SEVERITY_RANK[f.severity] >= threshold for f in findings) else exitcodes.OK


def statistics(findings: Iterable[Finding]) -> list[dict]:
    counts = Counter((f.code, f.name, f.severity) for f in findings)
    return [
        {"code": code, "name": name, "severity": severity, "count": n}
        for (code, name, severity), n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0][0]))
    ]


def _write_statistics(rows: list[dict], fmt: str) -> None:
    if fmt == "json":
        import json

        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return
    if not rows:
        sys.stdout.write("No findings.\n")
        return
    width = max(len(str(r["count"])) for r in rows)
    for r in rows:
        sys.stdout.write(f"{r['count']:>{width}}  {r['code']}  {r['severity']:<7}  {r['name']}\n")


# -- the command ------------------------------------------------------------------------------


def path_problem(path: str) -> str | None:
    """Why a path named on the command line cannot be checked, in one line; None when it can be."""
    import errno

    try:
        os.stat(path)
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return f"a symlink loop (it never reaches a file): {path}"
        if exc.errno == errno.EACCES:
            return f"permission denied: {path}"
        if os.path.islink(path):
            return f"a broken symlink (its target {os.readlink(path)!r} does not exist): {path}"
        if exc.errno == errno.ENOTDIR:
            return f"no such file or directory: {path} (a part of the path is not a directory)"
        if exc.errno == errno.ENAMETOOLONG:
            return f"the path is too long: {path[:80]}…"
        return f"no such file or directory: {path}"


def prepare(request: CheckRequest) -> Settings:
    """Validate the request and resolve the settings; raises UsageError."""
    from torchdoctor.rules.static import registry

    if request.fmt not in FORMATS:
        raise UsageError(f"unknown format {request.fmt!r}; choose one of: {', '.join(FORMATS)}")
    if request.statistics and request.fmt not in ("text", "json"):
        raise UsageError("--statistics prints text or json; drop --format or use --format json")
    if not request.paths:
        request.paths = ["."]
    for path in request.paths:
        problem = None if path == "-" else path_problem(path)
        if problem:
            raise UsageError(problem)
    if request.paths.count("-") > 1:
        raise UsageError("`-` (standard input) can be given once")
    first = next((p for p in request.paths if p != "-"), ".")
    try:
        settings = load(request.config, first)
        if request.fail_on is not None:
            settings.fail_on = check_fail_on(request.fail_on)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    if request.select is not None:
        settings.select = request.select
    settings.ignore = [*settings.ignore, *request.ignore]
    for selectors, where in ((settings.select, "select"), (settings.ignore, "ignore")):
        unknown = registry.unknown_selectors(selectors)
        if unknown:
            raise UsageError(f"unknown rule code or prefix in {where}: {unknown[0]} (see `torchdoctor rules`)")
    for codes in settings.per_file_ignores.values():
        unknown = registry.unknown_selectors(codes)
        if unknown:
            raise UsageError(f"unknown rule code or prefix in per-file-ignores: {unknown[0]}")
    unknown = registry.unknown_selectors(list(settings.severity))
    if unknown:
        raise UsageError(f"unknown rule code or prefix in severity: {unknown[0]}")
    if request.jobs is not None and request.jobs < 0:
        raise UsageError("--jobs must be 0 (automatic) or more")
    return settings


def run_check(request: CheckRequest) -> int:
    try:
        settings = prepare(request)
    except UsageError as exc:
        sys.stderr.write(f"torchdoctor: {exc}\n")
        return exitcodes.USAGE
    stdin = None
    if "-" in request.paths:
        from torchdoctor.textinput import InputError, read_stdin

        try:  # bounded: one byte over the limit is enough to report the input as too large
            stdin = read_stdin(settings.max_file_bytes, "pipe the source in, e.g. `cat train.py | torchdoctor check -`")
        except InputError as exc:
            sys.stderr.write(f"torchdoctor: {exc}\n")
            return exitcodes.USAGE
    report = build_report(request, settings, stdin)
    code = exit_code(report.findings, settings.fail_on)
    if request.statistics:
        _write_statistics(statistics(report.findings), request.fmt)
        return code
    from torchdoctor.diagnosis import diagnose
    from torchdoctor.render import render

    if request.fmt in ("text", "markdown", "json", "html"):
        diagnose(report)  # sarif and github carry findings only
    render(report, request.fmt, details=request.details)
    return code
