"""What every specialist shares: handler registration and FixReport assembly.

A specialist registers one handler per symptom id it knows (`@SPECIALIST.handles`)
and one `general` handler for symptoms routed to it as a second opinion. A
handler receives a `Case` (the symptom with its evidence, the contexts, the
command and target) and returns `Advice`; the specialist assembles the advice
for all its symptoms into one `FixReport`, primary symptom first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from torchdoctor.model import Fix, FixReport, Location, Symptom
from torchdoctor.rules import catalog


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
        """The script to name in commands: the user's own, or a placeholder."""
        if self.target and self.target.endswith(".py"):
            return self.target
        return "train.py"

    def value(self, key: str, default=None):
        """The first value named `key` in the symptom's evidence."""
        for ev in self.symptom.evidence:
            if key in ev.values:
                return ev.values[key]
        return default

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
        where = f"line {loc.line}"
        if self.target is None or loc.path != self.target:
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
        return handler(case)

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
        )


def _describe(ev) -> str:
    where = f"{ev.location}: " if ev.location is not None and ev.location.line else ""
    text = f"{where}{ev.summary}"
    if ev.quote and ev.quote not in ev.summary:
        text += f' — "{_clip(ev.quote)}"'
    return text


def _clip(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


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
