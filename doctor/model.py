"""The data model every door ends in: Symptom -> Route -> FixReport -> Report.

Plain dataclasses, no torch. `Report.to_dict()` is the JSON contract described
by `torchdoctor/schema/report.schema.json` (see `torchdoctor schema`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

SCHEMA_VERSION = "1.2"  # 1.1: Location.cell (a notebook cell); 1.2: Report.fit (`torchdoctor fit`), and
# Evidence.values keys declared, typed and unit-named in rules/data/evidence.toml (static rules' code-text
# keys step/count/target became step_call/accum_expr/target_expr; line, workers, epochs and the step counts
# are numbers)

SPECIALISTS: tuple[str, ...] = (
    "memory",
    "module-design",
    "distributed",
    "mixed-precision",
    "profiling",
    "debugging",
    "checkpointing",
    "autograd",
)

SEVERITIES: tuple[str, ...] = ("error", "warning", "info")
SEVERITY_RANK = {"error": 3, "warning": 2, "info": 1}

# Where a piece of evidence came from: a user's sentence, a pasted error
# message, a static rule reading the source, or a probe measuring a run.
EVIDENCE_KINDS: tuple[str, ...] = ("text", "error", "static", "probe")


def _plain(value: Any) -> Any:
    """Turn dataclasses (recursively) into JSON-ready dicts and lists."""
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


class _Serialisable:
    """Shared __repr__/__eq__/to_dict for the model's dataclasses.

    The dataclasses below are declared with repr=False, eq=False and inherit
    these instead: generating those methods per class costs several
    milliseconds at import, and `torchdoctor ask` must start fast.
    """

    def to_dict(self) -> dict[str, Any]:
        return {
            f.name: _plain(getattr(self, f.name))
            for f in fields(self)  # type: ignore[arg-type]
            if f.metadata.get("json", True)
        }

    def __repr__(self) -> str:
        inner = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self))  # type: ignore[arg-type]
        return f"{type(self).__name__}({inner})"

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(getattr(self, f.name) == getattr(other, f.name) for f in fields(self))  # type: ignore[arg-type]

    __hash__ = None  # mutable records, like dataclasses with eq=True


@dataclass(repr=False, eq=False)
class Location(_Serialisable):
    """A place in the user's code."""

    path: str
    line: int | None = None
    col: int | None = None
    end_line: int | None = None
    function: str | None = None
    code: str | None = None  # the source line, stripped
    cell: int | None = None  # notebooks: the 1-based cell (among all cells); line is within that cell

    def __str__(self) -> str:
        where = f"{self.path}:cell {self.cell}" if self.cell else self.path  # as `check` names a notebook's lines
        return f"{where}:{self.line}" if self.line else where


@dataclass(repr=False, eq=False)
class Evidence(_Serialisable):
    """One fact behind a symptom: what gave it away, in words and numbers."""

    kind: str  # one of EVIDENCE_KINDS
    summary: str  # one line in words
    quote: str | None = None  # the user's words or the error line that matched
    values: dict[str, Any] = field(default_factory=dict)  # measured or extracted numbers
    source: str | None = None  # signature id, rule code or probe name
    location: Location | None = None


@dataclass(repr=False, eq=False)
class Symptom(_Serialisable):
    """A catalogue id (rules/data/symptoms.toml) with where and how sure."""

    id: str
    confidence: float = 1.0  # 0..1
    severity: str = "warning"
    evidence: list[Evidence] = field(default_factory=list)
    location: Location | None = None
    step: int | None = None
    rank: int | None = None
    # Filled from the catalogue by `catalog.describe`; kept on the object so
    # renderers need not look anything up.
    title: str = ""
    specialist: str = ""  # primary specialist
    specialists: list[str] = field(default_factory=list)  # the catalogue route


@dataclass(repr=False, eq=False)
class RouteStep(_Serialisable):
    """One specialist on the route, and why it stands where it stands."""

    specialist: str
    why: str
    symptoms: list[str] = field(default_factory=list)
    row: str | None = None  # id of the routing-table row that decided, if any


@dataclass(repr=False, eq=False)
class Fix(_Serialisable):
    """One change, ranked by expected effect within its FixReport."""

    title: str
    why: str
    verify: str
    snippet: str | None = None
    applies_when: str | None = None  # the narrow case a piece of advice is limited to
    location: Location | None = None  # the user's line it is about, when known


@dataclass(repr=False, eq=False)
class FixReport(_Serialisable):
    """What one specialist says: diagnosis, evidence, ranked fixes, next steps."""

    specialist: str
    name: str
    diagnosis: str
    symptoms: list[str] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)
    fixes: list[Fix] = field(default_factory=list)
    next_steps: list[str] = field(default_factory=list)
    # symptom id -> title of the fix its handler wrote first: the summary's fix in a phrase. The fixes
    # are deduplicated across symptoms, so their order alone cannot say which fix is whose. Not in the JSON.
    leads: dict[str, str] = field(default_factory=dict, metadata={"json": False})


@dataclass(repr=False, eq=False)
class Choice(_Serialisable):
    label: str
    symptoms: list[str] = field(default_factory=list)
    contexts: list[str] = field(default_factory=list)


@dataclass(repr=False, eq=False)
class Question(_Serialisable):
    """One clarifying question, asked instead of guessing."""

    id: str
    text: str
    choices: list[Choice]
    specialist: str | None = None  # the area the question belongs to, if any


@dataclass(repr=False, eq=False)
class Finding(_Serialisable):
    """A static rule's match at a place in a file (`torchdoctor check`)."""

    code: str
    name: str
    severity: str
    symptom: str
    specialist: str
    path: str
    line: int
    col: int
    message: str
    fix: str
    end_line: int | None = None
    end_col: int | None = None
    cell: int | None = None  # notebooks: the 1-based cell (among all cells); line is within that cell
    frame: dict[str, Any] | None = None  # {"first_line": n, "lines": [...]}: source lines around `line`


@dataclass(repr=False, eq=False)
class RunError(_Serialisable):
    """The script's uncaught exception under `torchdoctor run`."""

    type: str
    message: str
    location: Location | None = None  # the user's deepest frame
    step: int | None = None  # optimizer steps completed when it was raised


@dataclass(repr=False, eq=False)
class RunInfo(_Serialisable):
    """How a `torchdoctor run` ended."""

    exit_code: int | None
    steps_completed: int
    stopped: str  # a value of rules/data/stopped.toml (doctor/stopped.py)
    duration_s: float
    command: list[str] = field(default_factory=list)
    signal: str | None = None
    ranks: int = 1
    probes: list[str] = field(default_factory=list)  # the probes that ran
    measurements: dict[str, dict[str, Any]] = field(default_factory=dict)  # probe -> measured numbers (unit in key)
    error: RunError | None = None
    # processes of the run still alive after the script ended: {"pid", "command", "ended_by"}, ended_by
    # SIGTERM or SIGKILL (torchdoctor ended it) or None (it could not be ended: it outlives the run)
    leftover_processes: list[dict[str, Any]] = field(default_factory=list)


@dataclass(repr=False, eq=False)
class Report(_Serialisable):
    """Everything a door found; every renderer reads only this."""

    command: str  # ask | check | run | fit | demo
    target: str | None = None
    symptoms: list[Symptom] = field(default_factory=list)
    contexts: list[str] = field(default_factory=list)
    route: list[RouteStep] = field(default_factory=list)
    reports: list[FixReport] = field(default_factory=list)
    question: Question | None = None
    findings: list[Finding] = field(default_factory=list)
    run: RunInfo | None = None
    environment: dict[str, Any] = field(default_factory=dict)
    artifacts: dict[str, str] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    fit: dict[str, Any] | None = None  # `torchdoctor fit`: the estimate (schema $defs/fit)
    schema_version: str = SCHEMA_VERSION
    tool: dict[str, str] = field(default_factory=lambda: {"name": "torchdoctor", "version": _version()})

    def worst_severity(self) -> str | None:
        levels = [f.severity for f in self.findings] + [s.severity for s in self.symptoms]
        return max(levels, key=SEVERITY_RANK.__getitem__) if levels else None

    def _repr_html_(self) -> str:
        """Jupyter shows a Report inline as HTML (render/html.py)."""
        from torchdoctor.render import to_html

        return to_html(self)


def _version() -> str:
    from torchdoctor import __version__

    return __version__
