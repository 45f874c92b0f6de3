"""The engine: one parse and one walk per file, then every rule on the nodes it subscribed to.

`analyse_unit` never raises for a user's file: anything that stops the
analysis (unreadable bytes, a syntax error, nesting too deep for the parser,
a bug in a rule) becomes a TD000 finding for that file, and the other files
are still checked. Nothing here imports or executes the code it reads.
"""

from __future__ import annotations

import ast
import gc
import re
import sys
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from torchdoctor.model import Finding
from torchdoctor.rules.static import registry
from torchdoctor.rules.static.api import Context, Hit, Rule, RuleDoc, milder, split_lines
from torchdoctor.rules.static.index import INDEX_NODES, Index
from torchdoctor.rules.static.semantic.projectclasses import ProjectClasses
from torchdoctor.rules.static.sources import Unit, UnreadableSource, read_unit, unit_from_bytes

FRAME_RADIUS = 2  # lines of context around a finding's line
MAX_BYTES = 2 * 2**20  # files larger than this get TD000 (generated data, not a training script)

# Leaf singletons (Load/Store, operators) have no children and are shared between
# nodes: they get no parent and are never visited.
_LEAVES = (ast.expr_context, ast.boolop, ast.operator, ast.unaryop, ast.cmpop)
_CHILD_FIELDS: dict[type, tuple[str, ...]] = {}

# The ASDL types of a node class's fields, as its docstring states them (`Dict(expr* keys, expr* values)`):
# fields of these types never hold a node the walk visits (names, numbers, strings, the leaf singletons).
_NOT_CHILDREN = frozenset({"identifier", "int", "string", "constant", "expr_context", "boolop", "operator",
                           "unaryop", "cmpop"})
_FIELD = re.compile(r"(\w+)([*?]?) (\w+)")
# class -> its child fields, last first, each with whether it holds a list; None where the docstring does not
# say (the walk then tests each value, as for a class it has never seen)
_LAYOUTS: dict[type, tuple[tuple[str, bool], ...] | None] = {}


@dataclass
class Options:
    """What the engine needs, picklable for worker processes."""

    codes: tuple[str, ...]  # enabled rule codes
    torch_version: tuple[int, int] | None = None
    max_bytes: int = MAX_BYTES
    project: ProjectClasses | None = None  # the checked project's module classes (projectclasses.py)


@dataclass
class Result:
    """One finding plus what the pipeline needs to turn it into a symptom."""

    finding: Finding
    values: dict[str, str] = field(default_factory=dict)
    code: str = ""  # the source line, stripped
    function: str | None = None
    reported: str = ""  # the level the rule reported (its own, or lower for a milder shape), before calibration


@dataclass
class FileResult:
    path: str
    results: list[Result] = field(default_factory=list)
    contexts: set[str] = field(default_factory=set)
    analysed: bool = True  # False when TD000 stopped the analysis
    facts: dict[str, list] = field(default_factory=dict)  # for the project pass (rules/static/project.py)
    read_path: str | None = None  # where the file was read from (the display path may be relative)


def _child_fields(cls: type) -> tuple[str, ...]:
    fields = _CHILD_FIELDS.get(cls)
    if fields is None:
        fields = tuple(f for f in cls._fields if f not in ("ctx", "op"))
        _CHILD_FIELDS[cls] = fields
    return fields


def _layout(cls: type) -> tuple[tuple[str, bool], ...] | None:
    """The fields of a node class that hold child nodes, read once from the class's own ASDL signature, so the
    walk asks no `isinstance` of a value: the largest cost of the walk was testing every field of every node."""
    head, _, rest = (cls.__doc__ or "").partition("(")
    if head.strip() != cls.__name__:
        return None
    if not rest:
        return () if not cls._fields else None  # `Pass`, `Break`: no fields, no parentheses
    if not rest.endswith(")"):
        return None
    found: list[tuple[str, bool]] = []
    names: list[str] = []
    for part in filter(None, (p.strip() for p in rest[:-1].split(","))):
        m = _FIELD.fullmatch(part)
        if m is None:
            return None
        kind, mark, name = m.groups()
        names.append(name)
        if kind not in _NOT_CHILDREN:
            found.append((name, mark == "*"))
    if names != list(cls._fields):
        return None  # a signature that does not match the class: trust nothing from it
    return tuple(reversed(found))


def _children(node: ast.AST) -> list[ast.AST]:
    """A node's children by testing each value: for a class whose signature `_layout` could not read."""
    children: list[ast.AST] = []
    AST, leaves = ast.AST, _LEAVES
    for name in _child_fields(node.__class__):
        value = getattr(node, name, None)
        if value.__class__ is list:
            for item in value:
                if isinstance(item, AST) and not isinstance(item, leaves):
                    children.append(item)
        elif isinstance(value, AST) and not isinstance(value, leaves):
            children.append(value)
    return children


def walk(tree: ast.AST, wanted: Iterable[type]) -> tuple[dict[type, list[ast.AST]], dict[ast.AST, ast.AST]]:
    """The one walk: parents of every node, and the nodes of the wanted types in source order."""
    buckets: dict[type, list[ast.AST]] = {t: [] for t in wanted}
    parents: dict[ast.AST, ast.AST] = {}
    stack: list[ast.AST] = [tree]
    pop, push = stack.pop, stack.append
    layouts = _LAYOUTS
    while stack:
        node = pop()
        cls = node.__class__
        bucket = buckets.get(cls)
        if bucket is not None:
            bucket.append(node)
        try:
            layout = layouts[cls]
        except KeyError:
            layout = layouts[cls] = _layout(cls)
        if layout is None:
            for child in reversed(_children(node)):
                parents[child] = node
                push(child)
            continue
        # children pushed last first, so they pop in source order
        for name, many in layout:
            value = getattr(node, name, None)
            if value is None:
                continue  # an optional field left empty (`returns`, `vararg`)
            if many:
                for child in reversed(value):
                    if child is not None:  # `Dict.keys` holds None for `**rest`, `kw_defaults` for no default
                        parents[child] = node
                        push(child)
            else:
                parents[value] = node
                push(value)
    return buckets, parents


_WANTED: dict[tuple, frozenset[type]] = {}
# The rules of the last call and their answer: every file of a run brings the same rules, and comparing them (by
# identity, in C) costs far less than building and hashing the key of their node types for each file.
_LAST_WANTED: list = [(), frozenset()]


def _wanted(rules: Sequence[Rule]) -> frozenset[type]:
    """The node types the walk collects for these rules and the index, worked out once per set of rules."""
    same = tuple(rules)
    if same == _LAST_WANTED[0] and same:
        return _LAST_WANTED[1]
    key = tuple((r.nodes, r.reads) for r in rules)
    found = _WANTED.get(key)
    if found is None:
        types = set(INDEX_NODES)
        for r in rules:
            types.update(r.nodes)
            types.update(r.reads)
        found = _WANTED[key] = frozenset(types)
    _LAST_WANTED[:] = [same, found]
    return found


_NARROWING: dict[int, tuple[Rule, tuple[frozenset[str], frozenset[str]]]] = {}


def _narrowing(r: Rule) -> tuple[frozenset[str], frozenset[str]]:
    """A rule's `callees=` and `methods=` as sets, worked out once per rule (a function among them called once)."""
    cached = _NARROWING.get(id(r))
    if cached is not None and cached[0] is r:
        return cached[1]
    found = (frozenset(r.callees() if callable(r.callees) else r.callees),
             frozenset(r.methods() if callable(r.methods) else r.methods))
    _NARROWING[id(r)] = (r, found)
    return found


def analyse_unit(unit: Unit, rules: Sequence[Rule], torch_version: tuple[int, int] | None = None,
                 project: ProjectClasses | None = None) -> FileResult:
    """All enabled rules on one source unit; never raises for the user's input."""
    # The cyclic garbage collector is paused for the file. Its passes are set off by allocations, and one file's
    # tree, index and facts are all allocated at once and all still alive, so every pass during the analysis
    # traverses the live tree and frees nothing: 8-9 % of `check`'s CPU time over torch's own files. The tree and
    # index are freed by reference counting when the file is done; a cycle made meanwhile is collected by the first
    # pass after the collector is back on.
    paused = gc.isenabled()
    if paused:
        gc.disable()
    try:
        return _analyse_unit(unit, rules, torch_version, project)
    finally:
        if paused:
            gc.enable()


def _analyse_unit(unit: Unit, rules: Sequence[Rule], torch_version: tuple[int, int] | None,
                  project: ProjectClasses | None) -> FileResult:
    result = FileResult(unit.path)
    for number, why in unit.skipped_cells:
        result.results.append(_td000(unit, f"cell {number} skipped ({why})", line=1, cell=number, severity="info"))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # invalid escape sequences and the like are not our findings
            tree = ast.parse(unit.text, filename=unit.path)
    except SyntaxError as exc:
        result.analysed = False
        result.results.append(_syntax_error(unit, exc))
        return result
    except (ValueError, TypeError) as exc:  # NUL bytes (Python < 3.12) and other unparsable text
        result.analysed = False
        result.results.append(_td000(unit, f"cannot parse the file: {exc}"))
        return result
    except (RecursionError, MemoryError):
        result.analysed = False
        result.results.append(_td000(unit, "the code is nested too deeply for Python's parser"))
        return result

    wanted = _wanted(rules)
    try:
        buckets, parents = walk(tree, wanted)
        index = Index(tree, buckets, parents, unit.text, project,
                      project.paths.get(unit.path) if project is not None else None)
        result.contexts = index.contexts()
    except (RecursionError, MemoryError):
        result.analysed = False
        result.results.append(_td000(unit, "the code is nested too deeply to analyse"))
        return result
    except Exception as exc:  # noqa: BLE001 - a bug of ours must not hide the other files' findings
        result.analysed = False
        result.results.append(_td000(unit, f"internal error while indexing ({type(exc).__name__}: {exc}); please report it"))
        return result

    ctx = Context(unit.path, unit.text, tree, index, torch_version)
    for r in rules:
        if r.check is None:
            continue
        ctx.rule = r
        try:
            for kind in r.nodes:
                nodes = buckets.get(kind, ())
                if kind is ast.Call and (r.callees or r.methods):
                    nodes = index.calls_named(*_narrowing(r))
                elif kind is ast.BinOp and r.ops:
                    nodes = index.binops(r.ops)
                for node in nodes:
                    r.check(node, ctx)
        except (RecursionError, MemoryError):
            result.results.append(_td000(unit, f"{r.code} stopped: the code is nested too deeply"))
        except Exception as exc:  # noqa: BLE001
            result.results.append(
                _td000(unit, f"{r.code} failed on this file ({type(exc).__name__}: {exc}); please report it")
            )
    if ctx.hits:
        result.results.extend(_findings(unit, ctx))
    result.facts = ctx.facts
    return result


def analyse_text(
    text: str,
    path: str = "<stdin>",
    codes: Iterable[str] | None = None,
    torch_version: tuple[int, int] | None = None,
) -> FileResult:
    """Convenience for tests and tools: analyse a string with the given (default: all) rules."""
    table = registry.rules()
    rules = [table[c] for c in (codes if codes is not None else table)]
    unit = Unit(path=path, text=text)
    result = analyse_unit(unit, rules, torch_version)
    # the project pass over this one file, as `check` runs it over a tree
    result.results += project_findings({path: unit}, [result], tuple(r.code for r in rules), [])
    return result


# -- findings ---------------------------------------------------------------------------------

_IGNORE = re.compile(r"#\s*torchdoctor\s*:\s*ignore\b(?:\[([^\]]*)\])?", re.IGNORECASE)


def suppressions(text: str) -> dict[int, set[str] | None]:
    """Inline `# torchdoctor: ignore[TD101,TD204]` (codes or prefixes) or a bare `ignore`, by line."""
    if "torchdoctor" not in text:
        return {}
    table: dict[int, set[str] | None] = {}
    for number, line in enumerate(split_lines(text), 1):
        if "torchdoctor" not in line:
            continue
        for m in _IGNORE.finditer(line):
            if m.group(1) is None:
                table[number] = None
            elif table.get(number, set()) is not None:
                codes = {c.strip().upper() for c in m.group(1).split(",") if c.strip()}
                table.setdefault(number, set()).update(codes)  # type: ignore[union-attr]
    return table


def _suppressed(table: dict[int, set[str] | None], line: int, code: str) -> bool:
    if line not in table:
        return False
    codes = table[line]
    return codes is None or any(code.startswith(c) for c in codes)


def _char_col(line: str, byte_col: int) -> int:
    """ast columns count UTF-8 bytes; findings count characters, 1-based."""
    if line.isascii():
        return byte_col + 1
    return len(line.encode("utf-8")[:byte_col].decode("utf-8", "replace")) + 1


def _frame(lines: list[str], line: int, first: int = 1, last: int | None = None) -> dict:
    last = len(lines) if last is None else last
    start = max(first, line - FRAME_RADIUS)
    end = min(last, line + FRAME_RADIUS)
    return {"first_line": start, "lines": [lines[i - 1].rstrip() for i in range(start, end + 1) if 0 < i <= len(lines)]}


def _findings(unit: Unit, ctx: Context) -> Iterator[Result]:
    lines = ctx.lines
    ignored = suppressions(unit.text)
    seen: set[tuple[str, int, int]] = set()
    for hit in sorted(ctx.hits, key=lambda h: (getattr(h.node, "lineno", 1), getattr(h.node, "col_offset", 0))):
        try:
            # A list, so that a rule's bug (a message template missing a value) is caught here, per hit.
            found = list(_finding(unit, hit, lines, ignored, seen, ctx))
        except Exception as exc:  # noqa: BLE001 - one rule's bug must not end the run for every other rule
            found = [_td000(unit, f"{hit.rule.doc.code} failed on this file while writing its finding "
                                  f"({type(exc).__name__}: {exc}); please report it",
                            line=getattr(hit.node, "lineno", 1) or 1)]
        yield from found


def _finding(
    unit: Unit,
    hit: Hit,
    lines: list[str],
    ignored: dict[int, set[str] | None],
    seen: set[tuple[str, int, int]],
    ctx: Context,
) -> Iterator[Result]:
    doc = hit.rule.doc
    node = hit.node
    line = getattr(node, "lineno", 1) or 1
    if _suppressed(ignored, line, doc.code):
        return
    key = (doc.code, line, getattr(node, "col_offset", 0))
    if key in seen:
        return
    seen.add(key)
    text = lines[line - 1] if 0 < line <= len(lines) else ""
    col = _char_col(text, getattr(node, "col_offset", 0) or 0)
    end_line = getattr(node, "end_lineno", None)
    end_col = None
    if hasattr(node, "body") and isinstance(node, ast.stmt):
        end_line, end_col = line, len(text.rstrip()) + 1  # a def/class/loop: its header line only
    elif end_line is not None and 0 < end_line <= len(lines):
        end_col = _char_col(lines[end_line - 1], getattr(node, "end_col_offset", 0) or 0)
    values = _lines_as_cells(unit, line, hit.values) if unit.cells else hit.values
    message = doc.message.format_map(values)
    fix = doc.fix.format_map(values)
    cell_number = None
    shown_line, shown_end = line, end_line
    first, last = 1, len(lines)
    if unit.cells:
        cell, shown_line = unit.cell_at(line)
        if cell is not None:
            cell_number = cell.number
            first, last = cell.first_line, cell.first_line + cell.line_count - 1
            shown_end = end_line - cell.first_line + 1 if end_line is not None else None
    frame = _frame(lines, line, first, last)
    if cell_number is not None:
        frame["first_line"] = frame["first_line"] - first + 1
    fn = ctx.index.function_of(node)
    yield Result(
        Finding(
            code=doc.code,
            name=doc.name,
            severity=milder(hit.severity or doc.severity, doc.level),
            symptom=doc.symptom,
            specialist=doc.specialist,
            path=unit.path,
            line=shown_line,
            col=col,
            message=message,
            fix=fix,
            end_line=shown_end,
            end_col=end_col,
            cell=cell_number,
            frame=frame,
        ),
        values=dict(values),
        code=text.strip(),
        function=fn.name if fn is not None else None,
        reported=hit.severity or doc.severity,
    )


_LINE_REF = re.compile(r"\bline (\d+)\b")


def _lines_as_cells(unit: Unit, line: int, values: dict) -> dict:
    """Rules name other lines by their number in the notebook's joined source ("line 371 loads the same file");
    the user sees cells. Each such reference becomes the line within its cell, with the cell named when it is not
    the finding's own."""
    own, _ = unit.cell_at(line)

    def shown(match: re.Match) -> str:
        cell, within = unit.cell_at(int(match.group(1)))
        if cell is None:
            return match.group(0)
        return f"line {within}" if cell is own else f"cell {cell.number} line {within}"

    return {k: _LINE_REF.sub(shown, v) if isinstance(v, str) else v for k, v in values.items()}


def _td000_doc() -> RuleDoc:
    return registry.rules()["TD000"].doc


def _td000(unit: Unit, reason: str, line: int = 1, col: int = 1, cell: int | None = None, severity: str | None = None) -> Result:
    doc = _td000_doc()
    lines = split_lines(unit.text) if unit.text else []
    if unit.cells and cell is None and line:
        found, in_cell = unit.cell_at(line)
        if found is not None:
            cell, frame_first, frame_last = found.number, found.first_line, found.first_line + found.line_count - 1
            frame = _frame(lines, line, frame_first, frame_last)
            frame["first_line"] -= frame_first - 1
            line = in_cell
        else:
            frame = None
    else:
        frame = _frame(lines, line) if lines and line <= len(lines) and len(lines[line - 1]) < 2000 else None
    message = doc.message.format_map({"reason": reason})
    return Result(
        Finding(
            code=doc.code,
            name=doc.name,
            severity=severity or doc.severity,
            symptom=doc.symptom,
            specialist=doc.specialist,
            path=unit.path,
            line=line,
            col=col,
            message=message,
            fix=doc.fix,
            cell=cell,
            frame=frame,
        ),
        values={"reason": reason},
    )


def _syntax_error(unit: Unit, exc: SyntaxError) -> Result:
    line = exc.lineno or 1
    msg = exc.msg or "invalid syntax"
    hint = ""
    if "Missing parentheses in call to" in msg or "multiple exception types must be parenthesized" in msg:
        hint = " (Python 2 code?)"
    elif re.search(r"^\s*print\s+[^(=\s]", unit.text, re.MULTILINE) and "print" in (exc.text or ""):
        hint = " (Python 2 code?)"
    col = max(1, exc.offset or 1)
    where = f"line {line}"
    if unit.cells:
        cell, in_cell = unit.cell_at(line)
        if cell is not None:
            where = f"cell {cell.number}, line {in_cell}"
    if msg.startswith("f-string") and sys.version_info < (3, 12):
        # PEP 701: quotes, backslashes and comments inside f-string braces are valid from Python 3.12 on, so
        # this is the analyser's Python falling short, not the file's error.
        running = f"{sys.version_info[0]}.{sys.version_info[1]}"
        return _td000(unit, f"the f-string at {where} does not parse on Python {running} ({msg}); Python 3.12 "
                            "and later accept quotes and backslashes inside the braces, so for a project on 3.12+ "
                            "the file is fine and only torchdoctor's Python cannot read it", line=line, col=col)
    return _td000(unit, f"syntax error at {where}: {msg}{hint}", line=line, col=col)


# -- files ------------------------------------------------------------------------------------


def analyse_file(path: str, display: str, options: Options, data: bytes | None = None) -> FileResult:
    """Read and analyse one file; unreadable files become a TD000 result. `data`: the file's bytes when the
    project pre-pass has read them already (check.project_classes), so a file is read once."""
    table = registry.rules()
    rules = [table[c] for c in options.codes if c in table]
    try:
        unit = read_unit(path, display, options.max_bytes) if data is None else unit_from_bytes(display, data)
    except UnreadableSource as exc:
        return _unreadable(display, str(exc))
    result = analyse_unit(unit, rules, options.torch_version, options.project)
    result.read_path = path
    return result


def finding_at(unit: Unit, code: str, line: int, col: int, values: dict, severity: str | None = None) -> Result | None:
    """A finding a project pass made (rules/static/project.py), with its code frame, as `_finding` makes one;
    None when the line carries a suppression for the code."""
    rule = registry.rules()[code]
    node = ast.Pass(lineno=line, col_offset=max(col - 1, 0), end_lineno=line, end_col_offset=max(col - 1, 0))
    kept = {k: v if isinstance(v, str | bool | int | float) else str(v) for k, v in values.items()}
    ctx = Context(unit.path, unit.text, ast.Module(body=[], type_ignores=[]), _NoIndex(), None)
    found = list(_finding(unit, Hit(rule, node, kept, severity), ctx.lines, suppressions(unit.text), set(), ctx))
    return found[0] if found else None


def project_findings(units: dict[str, Unit | None], results: list[FileResult], codes: tuple[str, ...],
                     roots: list[str]) -> list[Result]:
    """Run the project pass over the files' facts; `units` gives each display path's source (None: read it)."""
    from torchdoctor.rules.static import project

    module_name = project.module_namer(roots)
    files = [project.ProjectFile(r.path, module_name(r.read_path or r.path), r.facts) for r in results if r.facts]
    if not files:
        return []
    where = {r.path: r.read_path or r.path for r in results}
    # One cause, one finding: a project hit the file's own analysis already made (a model and the loop that
    # trains it in one file, joined by the project pass too) is not reported twice.
    seen = {(r.path, x.finding.code, x.finding.line) for r in results for x in r.results}
    out: list[Result] = []
    for code, hits in sorted(project.run(files, codes).items()):
        for hit in hits:
            if (hit.path, code, hit.line) in seen:
                continue
            unit = units.get(hit.path)
            if unit is None:
                try:
                    unit = units[hit.path] = read_unit(where.get(hit.path, hit.path), hit.path, MAX_BYTES * 8)
                except UnreadableSource:
                    continue
            found = finding_at(unit, code, hit.line, hit.col, hit.values, hit.severity)
            if found is not None:
                out.append(found)
                seen.add((hit.path, code, hit.line))  # two passes of one rule at one line: the first says it
    return out


class _NoIndex:
    """`_finding` asks the index for the enclosing function: a project finding has none to give."""

    def function_of(self, node: ast.AST) -> None:
        return None


def analyse_bytes(data: bytes, display: str, options: Options) -> FileResult:
    table = registry.rules()
    rules = [table[c] for c in options.codes if c in table]
    if len(data) > options.max_bytes:
        return _unreadable(display, f"the input is over the {options.max_bytes / 2**20:.1f} MiB limit")  # read only to it
    try:
        unit = unit_from_bytes(display, data)
    except UnreadableSource as exc:
        return _unreadable(display, str(exc))
    result = analyse_unit(unit, rules, options.torch_version)
    # standard input is a project of its own: its project pass runs here, where its text is at hand
    result.results += project_findings({display: unit}, [result], options.codes, [])
    result.facts = {}
    return result


def _unreadable(display: str, reason: str) -> FileResult:
    return FileResult(display, [_td000(Unit(display, ""), reason)], analysed=False)


def analyse_batch(items: Sequence[tuple[str, str]], options: Options) -> list[FileResult]:
    """A worker's share: several (path, display) pairs, to amortise inter-process overhead."""
    return [analyse_file(path, display, options) for path, display in items]
