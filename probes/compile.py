"""The compile probe: torch.compile's graph breaks and recompilations, with the user's lines and reasons.

Measures
--------
- graph breaks: every record of dynamo's `graph_breaks` log artifact (the
  `torch._dynamo.*.__graph_breaks` loggers), parsed into the user's file and
  line, the reason ("Data-dependent branching", "Failed to trace builtin
  operator") and dynamo's explanation;
- recompilations: every record of the `recompiles` artifact ("Recompiling
  function forward in train.py:12 triggered by … tensor 'x' size mismatch
  at index 1. expected 4, actual 5"): the function, its file and line, and
  the guard that failed; and dynamo's warning when a function hits
  `recompile_limit`;
- at the end, dynamo's own counters (`torch._dynamo.utils.counters`):
  frames compiled, unique graphs, graph breaks by reason.
Both artifacts are switched on in torch's log state and read by our own
handler, which does not propagate: the script's output is unchanged (if
TORCH_LOGS already asked for them, they still print as asked). Nothing is
imported: the loggers are attached when the script's torch imports dynamo.

`--compile-backend eager` (the TORCHDOCTOR_COMPILE_BACKEND variable in the
script's process) makes every `torch.compile` call use that backend, dropping
`mode` and `options`: graph breaks and guards come from dynamo's tracing,
before any backend runs, so they are found in seconds on a CPU instead of
after minutes of inductor compilation. Timings then no longer reflect the
real backend; the report says which backend was replaced.

Cost: none until dynamo logs something; a regular expression per log
record. Compilation itself is unchanged (the log records are built by dynamo
anyway for its structured trace).

Symptoms (thresholds in rules/data/thresholds.toml, [compile]; classified in
doctor/analysis/compile.py)
-----------------------------------------------------------------------------
- graph-break: at least `min_graph_breaks` distinct break sites;
- recompile: a function recompiled at least `min_recompiles` times, or hit
  the recompile limit.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from typing import Any

from torchdoctor.probes.base import Probe
from torchdoctor.probes.importwatch import when_imported
from torchdoctor.probes.patches import compile_watch
from torchdoctor.probes.userframes import is_library_file

BACKEND_ENV = "TORCHDOCTOR_COMPILE_BACKEND"
ARTIFACTS = ("graph_breaks", "recompiles")
_AT = re.compile(r"in user code at (?P<path>.+?):(?P<line>\d+)\s*$", re.M)
_FILE = re.compile(r'File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<function>\S+)')
_REASON = re.compile(r"Graph Break Reason: (?P<reason>.*)")
_EXPLANATION = re.compile(r"^\s*Explanation: (?P<text>.*)$", re.M)
_RECOMPILE = re.compile(r"Recompiling function (?P<function>\S+) in (?P<path>.+):(?P<line>\d+)")
_GUARD = re.compile(r"^\s*- (?:\d+/\d+: )?(?P<guard>.+)$", re.M)
_LIMIT = re.compile(r"hit config\.(?P<kind>\w+) \((?P<limit>\d+)\)")
_LIMIT_FN = re.compile(r"function: '(?P<function>[^']+)' \((?P<path>.+):(?P<line>\d+)\)")
_LAST = re.compile(r"last reason: (?P<reason>.*)")
_GENERIC = ("Encountered graph break when attempting to trace",)


class _Handler(logging.Handler):
    def __init__(self, probe: CompileProbe) -> None:
        super().__init__(logging.DEBUG)
        self.probe = probe

    def emit(self, record: logging.LogRecord) -> None:
        probe = self.probe
        if not probe.enabled:
            return
        try:
            probe.record(record)
        except Exception as exc:  # noqa: BLE001 - never let logging raise into dynamo
            probe.enabled = False
            probe.emit("probe-error", where="log", error=f"{type(exc).__name__}: {exc}"[:500])


class CompileProbe(Probe):
    name = "compile"

    def install(self) -> None:
        import torch

        self.torch = torch
        self.max_events = int(self.options.get("max_events", 200))
        self.events_left = self.max_events
        self.handler = _Handler(self)
        self.attached: set[str] = set()
        self.user_asked: set[str] = set()
        self.watch = compile_watch(torch)
        backend = os.environ.get(BACKEND_ENV) or None
        if backend:
            self.watch.backend = backend
        try:
            from torch._logging._internal import log_state
        except ImportError:
            self.note("this torch has no torch._logging: graph breaks and recompiles are counted, not located")
            log_state = None
        if log_state is not None:
            for artifact in ARTIFACTS:
                if log_state.is_artifact_enabled(artifact):
                    self.user_asked.add(artifact)
                log_state.enable_artifact(artifact)
        self.watch.subscribe(self, self._attach)
        when_imported("torch._dynamo", lambda _m: self._attach())

    def _attach(self) -> None:
        """Put our handler on dynamo's graph-break and recompile loggers (new ones too)."""
        try:
            from torch._logging._internal import log_registry
        except ImportError:
            return
        for qname in list(log_registry.get_artifact_log_qnames()):
            artifact = qname.rsplit(".__", 1)[-1]
            if artifact not in ARTIFACTS or qname in self.attached:
                continue
            logger = logging.getLogger(qname)
            logger.setLevel(logging.DEBUG)
            if artifact not in self.user_asked:
                logger.propagate = False  # keep the script's output as it was
            logger.addHandler(self.handler)
            self.attached.add(qname)
        limit_log = "torch._dynamo.convert_frame"
        if limit_log not in self.attached:
            logging.getLogger(limit_log).addHandler(self.handler)
            self.attached.add(limit_log)

    # -- parsing ----------------------------------------------------------------------------------

    def record(self, record: logging.LogRecord) -> None:
        if self.events_left <= 0:
            return
        text = record.getMessage()
        if record.name.endswith("__graph_breaks"):
            event = parse_graph_break(text)
        elif record.name.endswith("__recompiles"):
            event = parse_recompile(text)
        elif "hit config." in text:
            event = parse_limit(text)
        else:
            return
        if event is None:
            return
        kind = event.pop("kind")
        self.events_left -= 1
        self.emit(kind, **event)

    def finish(self, reason: str) -> None:
        summary: dict[str, Any] = {"compile_calls": self.watch.calls, "backend_forced": self.watch.backend,
                                   "backends_replaced": sorted(set(self.watch.forced))}
        utils = sys.modules.get("torch._dynamo.utils")
        counters = getattr(utils, "counters", None) if utils is not None else None
        if counters is not None:
            try:
                summary["frames"] = dict(counters["frames"])
                summary["unique_graphs"] = int(counters["stats"]["unique_graphs"])
                summary["graph_break_count"] = int(sum(counters["graph_break"].values()))
                summary["graph_break_reasons"] = [first_line(r) for r in list(counters["graph_break"])[:10]]
            except Exception:  # noqa: BLE001 - counters' layout changes between versions
                pass
        self.emit("compile-summary", dynamo=utils is not None, **summary)


def first_line(text: str) -> str:
    return text.strip().splitlines()[0][:200] if text.strip() else ""


def _user_frame(text: str) -> tuple[str, int, str] | None:
    frames = [(m["path"], int(m["line"]), m["function"]) for m in _FILE.finditer(text)]
    for path, line, function in reversed(frames):
        if not is_library_file(path):
            return path, line, function
    return frames[-1] if frames else None


def parse_graph_break(text: str) -> dict[str, Any] | None:
    """A graph-break log record -> {path, line, reason, explanation, duplicate}."""
    event: dict[str, Any] = {"kind": "graph-break", "duplicate": "user stack suppressed" in text}
    at = _AT.search(text.split("\n", 1)[0] + "\n") or _AT.search(text)
    frame = _user_frame(text)
    if at is not None and not is_library_file(at["path"]):
        event.update(path=at["path"], line=int(at["line"]))
        if frame is not None and frame[0] == at["path"] and frame[1] == int(at["line"]):
            event["function"] = frame[2]
    elif frame is not None:
        event.update(path=frame[0], line=frame[1], function=frame[2])
    elif at is not None:
        event.update(path=at["path"], line=int(at["line"]))
    reason = _REASON.search(text)
    if reason is not None:
        lines = [line.strip() for line in text[reason.start("reason"):].splitlines()]
        useful = [ln for ln in lines if ln and not ln.startswith(_GENERIC) and not ln.startswith(("Explanation:",
                                                                                                  "Hint:"))]
        event["reason"] = (useful[0] if useful else lines[0])[:300]
    elif text.startswith("Graph break:"):
        event["reason"] = first_line(text.split(":", 1)[1])
    else:
        event["reason"] = first_line(text)
    explanation = _EXPLANATION.search(text)
    if explanation is not None:
        event["explanation"] = explanation["text"].strip()[:400]
    return event


def parse_recompile(text: str) -> dict[str, Any] | None:
    m = _RECOMPILE.search(text)
    if m is None:
        return None
    guards = [g["guard"].strip() for g in _GUARD.finditer(text)]
    return {"kind": "recompile", "function": m["function"], "path": m["path"], "line": int(m["line"]),
            "guards": guards[:8], "guard": guards[0] if guards else None}


def parse_limit(text: str) -> dict[str, Any] | None:
    m = _LIMIT.search(text)
    if m is None:
        return None
    event: dict[str, Any] = {"kind": "recompile-limit", "limit_kind": m["kind"], "limit": int(m["limit"])}
    fn = _LIMIT_FN.search(text)
    if fn is not None:
        event.update(function=fn["function"], path=fn["path"], line=int(fn["line"]))
    last = _LAST.search(text)
    if last is not None:
        event["last_reason"] = last["reason"].strip()[:300]
    return event
