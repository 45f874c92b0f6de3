"""What every specialist shares: handler registration and FixReport assembly.

A specialist registers one handler per symptom id it knows (`@SPECIALIST.handles`)
and one `general` handler for symptoms routed to it as a second opinion. A
handler receives a `Case` (the symptom with its evidence, the contexts, the
command and target) and returns `Advice`; the specialist assembles the advice
for all its symptoms into one `FixReport`, primary symptom first.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from torchdoctor.clip import clip
from torchdoctor.model import Fix, FixReport, Location, Symptom
from torchdoctor.rules import catalog
from torchdoctor.rules.evidence import CHECK_ENV, require_declared


def _same_file(path: str, target: str) -> bool:
    """Whether a location path and the target name one file (`train.py`, `/tmp/x/train.py`); both are
    relative to the working directory of the diagnosis. Strings only: nothing is read."""
    return path == target or os.path.abspath(path) == os.path.abspath(target)


@dataclass
class Case:
    symptom: Symptom
    contexts: frozenset[str]
    command: str  # ask | check | run | demo
    target: str | None  # the user's script or path, when known
    routed: list[Symptom] = field(default_factory=list)  # every symptom routed to this specialist

    # -- small helpers handlers use to write for the user's own code ---------

    @property
    def script(self) -> str:
        """The script to name in commands: the user's own, or a placeholder.

        `ask` keeps the user's sentence as its target, so only a single path
        ending in .py counts (a notebook's path would make `python …` and `torchrun …`
        commands wrong); a located symptom names its own file, spelled as the
        target spells it when the target is that file (`demo` names its patient
        by an absolute path so the commands work from any folder).
        """
        loc = self.location
        path = loc.path if loc is not None else None
        if path and self.target and _same_file(path, self.target):
            path = self.target
        for candidate in (path, self.target):
            if candidate and candidate.endswith(".py") and not any(ch.isspace() for ch in candidate):
                return candidate
        return "train.py"

    def value(self, key: str, default=None):
        """The first value named `key` in the symptom's evidence."""
        if os.environ.get(CHECK_ENV):
            require_declared(key)
        for ev in self.symptom.evidence:
            if key in ev.values:
                return ev.values[key]
        return default

    def _first(self, keys: tuple[str, ...]):
        for key in keys:
            v = self.value(key)
            if v is not None:
                return v
        return None

    def num(self, *keys: str) -> float | None:
        """The first numeric value among `keys` (aliases), or None when missing or not a number."""
        for key in keys:
            v = self.value(key)
            if isinstance(v, str):
                try:
                    v = float(v.strip().rstrip("%"))
                except ValueError:
                    continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:  # v != v: NaN
                continue
            return v
        return None

    def text(self, *keys: str) -> str | None:
        """The first non-empty string value among `keys`, stripped, or None."""
        for key in keys:
            v = self.value(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                v = str(v)
            if isinstance(v, str) and v.strip():
                return v.strip()
        return None

    def names(self, *keys: str) -> list[str]:
        """A list of names: a list of strings, or one string like '"a", "b"' or 'a, b'."""
        v = self._first(keys)
        if isinstance(v, str):
            v = v.strip().strip("[]()").split(",")
        if not isinstance(v, (list, tuple)):
            return []
        out = [str(x).strip().strip("'\"` ") for x in v if isinstance(x, (str, int))]
        return [x for x in out if x]

    def dims(self, *keys: str) -> list[int]:
        """A shape as a list of ints, from a list or a string ('64x512', '[64, 512]', 'torch.Size([2, 3])')."""
        v = self._first(keys)
        if isinstance(v, (list, tuple)):
            return [int(x) for x in v if isinstance(x, int) and not isinstance(x, bool)]
        if isinstance(v, str):
            return [int(d) for d in re.findall(r"-?\d+", v)]
        return []

    @property
    def sources(self) -> set[str]:
        """The signature ids, rule codes and probe names behind the evidence."""
        return {ev.source for ev in self.symptom.evidence if ev.source}

    @property
    def step(self) -> int | None:
        if self.symptom.step is not None:
            return self.symptom.step
        v = self.num("step")
        return int(v) if v is not None else None

    @property
    def rank(self) -> int | None:
        if self.symptom.rank is not None:
            return self.symptom.rank
        v = self.num("rank")
        return int(v) if v is not None else None

    def rule_code(self, family: str) -> str:
        """The static rule that raised this symptom (e.g. TD301), else the family prefix (TD3)."""
        for ev in self.symptom.evidence:
            if ev.kind == "static" and ev.source and ev.source.startswith(family) and len(ev.source) == 5:
                return ev.source
        return family

    @property
    def location(self) -> Location | None:
        if self.symptom.location is not None:
            return self.symptom.location
        for ev in self.symptom.evidence:
            if ev.location is not None:
                return ev.location
        return None

    def at(self, fallback: str = "") -> str:
        """'line 42 (`total_loss += loss`)' when the line is known, else `fallback`."""
        loc = self.location
        if loc is None or loc.line is None:
            return fallback
        where = f"cell {loc.cell}, line {loc.line}" if loc.cell else f"line {loc.line}"  # as `check` words it
        if self.target is None or not _same_file(loc.path, self.target):
            where += f" of {loc.path}"
        if loc.code:
            where += f" (`{loc.code.strip()}`)"
        return where

    def has(self, *contexts: str) -> bool:
        return any(c in self.contexts for c in contexts)

    def run_cmd(self, *probes: str, extra: str = "") -> str:
        parts = ["torchdoctor run"]
        parts += [f"--probe {p}" for p in probes]
        if extra:
            parts.append(extra)
        parts.append(self.script)
        return " ".join(parts)

    def fit_cmd(self, gpu_gib: float | None = None) -> str:
        """`torchdoctor fit` for the user's script, on the card that ran out when its size is known, with
        the arguments the script ran with when a run recorded them."""
        card = f" --gpu {gpu_gib:.0f}GB" if gpu_gib else ""
        args = self.value("script_args")
        if args is None:
            tail = " -- <your script's arguments>"
        else:
            import shlex

            tail = f" -- {shlex.join(args)}" if args else ""
        return f"torchdoctor fit {self.script}{card}{tail}"

    def check_cmd(self, select: str = "") -> str:
        return f"torchdoctor check {'--select ' + select + ' ' if select else ''}{self.script}"


@dataclass
class Advice:
    diagnosis: str
    fixes: list[Fix] = field(default_factory=list)
    next_steps: list[str] = field(default_factory=list)


Handler = Callable[[Case], Advice]


class Specialist:
    def __init__(self, specialist_id: str):
        self.id = specialist_id
        self.name = catalog.specialist_names()[specialist_id]
        self.handlers: dict[str, Handler] = {}
        self._general: Handler | None = None

    def handles(self, *symptom_ids: str) -> Callable[[Handler], Handler]:
        def register(fn: Handler) -> Handler:
            for sid in symptom_ids:
                catalog.symptom(sid)  # fail loudly on a typo in an id
                self.handlers[sid] = fn
            return fn

        return register

    def general(self, fn: Handler) -> Handler:
        self._general = fn
        return fn

    def advise(self, case: Case) -> Advice:
        handler = self.handlers.get(case.symptom.id, self._general)
        if handler is None:
            raise LookupError(f"specialist {self.id} has no handler for {case.symptom.id} and no general one")
        return _anchor(handler(case), case, dedicated=handler is not self._general)

    def consult(
        self,
        symptoms: list[Symptom],
        contexts: Iterable[str] = (),
        command: str = "ask",
        target: str | None = None,
    ) -> FixReport:
        ctx = frozenset(contexts)
        ordered = sorted(symptoms, key=lambda s: -s.confidence)
        advices = [self.advise(Case(s, ctx, command, target, ordered)) for s in ordered]
        if not advices:  # routed here by a choice with no symptom: the general view
            empty = catalog.make_symptom(_topic_for(self.id), confidence=0.0)
            advices = [self.advise(Case(empty, ctx, command, target, []))]

        fixes: list[Fix] = []
        seen_titles: set[str] = set()
        for advice in advices:
            for fix in advice.fixes:
                if fix.title not in seen_titles:
                    seen_titles.add(fix.title)
                    fixes.append(fix)
        from torchdoctor.specialists.frameworks import in_framework_terms

        fixes = in_framework_terms(fixes, ctx)  # Lightning / Trainer / Accelerate knob first, where one is used
        next_steps: list[str] = []
        for advice in advices:
            for step in advice.next_steps:
                if step not in next_steps:
                    next_steps.append(step)

        diagnosis = advices[0].diagnosis
        return FixReport(
            specialist=self.id,
            name=self.name,
            diagnosis=diagnosis,
            symptoms=[s.id for s in ordered],
            evidence=[_describe(ev) for s in ordered for ev in s.evidence],
            fixes=fixes,
            next_steps=next_steps,
            # not strict: asked with no symptom, the one advice is the general view and `ordered` is empty
            leads={s.id: a.fixes[0].title for s, a in zip(ordered, advices, strict=False) if a.fixes},
        )


def _anchor(advice: Advice, case: Case, dedicated: bool) -> Advice:
    """Make sure located evidence reaches the report: the diagnosis names the
    line, and (for a dedicated handler) a fix points at it. Handlers do this
    themselves where they know which fix the line belongs to. General advice
    from another specialist's angle names the line but pins no fix to it: its
    fixes are not changes to that line."""
    if advice.diagnosis[:1].islower():
        advice.diagnosis = advice.diagnosis[0].upper() + advice.diagnosis[1:]
    loc = case.location
    if loc is None or not loc.line:
        return advice
    if f"line {loc.line}" not in advice.diagnosis.lower():
        advice.diagnosis = f"At {case.at()}: {advice.diagnosis}"
    if not dedicated:
        for fix in advice.fixes:
            if fix.location == loc:
                fix.location = None
        return advice
    if advice.fixes and not any(f.location is not None for f in advice.fixes):
        code_fix = next((f for f in advice.fixes if f.snippet and not is_shell(f.snippet)), advice.fixes[0])
        code_fix.location = loc
    return advice


_SHELL = re.compile(
    r"^(?:[A-Z][A-Z0-9_]*=\S*\s|(?:torchdoctor|python3?|torchrun|py-spy|nvidia-smi|pip|git|docker|head|df|nc|ulimit)\b)"
)


def is_shell(snippet: str) -> bool:
    """A snippet that is a shell command line rather than Python."""
    return bool(_SHELL.match(snippet.lstrip()))


def _describe(ev) -> str:
    where = f"{ev.location}: " if ev.location is not None and ev.location.line else ""
    text = f"{where}{ev.summary}"
    if ev.quote and ev.quote not in ev.summary:
        text += f' — "{clip(ev.quote, 160, one_line=True)}"'
    return text


# The topic symptom each specialist falls back on when asked without symptoms.
_TOPICS = {
    "memory": "high-memory",
    "module-design": "model-structure",
    "distributed": "distributed-setup",
    "mixed-precision": "mixed-precision-setup",
    "profiling": "slow-step",
    "debugging": "loss-not-decreasing",
    "checkpointing": "checkpoint-setup",
    "autograd": "custom-function",
}


def _topic_for(specialist_id: str) -> str:
    return _TOPICS[specialist_id]
