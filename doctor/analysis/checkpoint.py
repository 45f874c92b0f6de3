"""Checkpoints as written and read: what each save holds against what a resume needs, how loads went.

Reads the checkpoint probe's events (probes/checkpoint.py): `save`, `load`,
`load-state-dict`, `checkpoint-summary`. Thresholds: rules/data/thresholds.toml
[checkpoint].

A save is judged as a checkpoint when the script can resume from one
(doctor/analysis/resume.py: it loaded one before training ended, its source
has a resume path, the file is named as a checkpoint) and training went on
after it (more optimizer steps followed) or it holds more than the weights
(a dict with weights and anything else). A best-model file in a script that
never resumes, or a final `torch.save(model.state_dict())` after the last
step, is an export of the weights, not an incomplete checkpoint.
"""

from __future__ import annotations

import ast
import linecache
import os
import re
from functools import lru_cache
from typing import Any

from torchdoctor.analysis import Analysis
from torchdoctor.analysis.evidence import RunEvidence
from torchdoctor.analysis.resume import RESUME_WORDS, can_resume
from torchdoctor.analysis.sites import location, plural
from torchdoctor.model import Evidence

PROBE = "checkpoint"


def analyse(run: RunEvidence) -> Analysis:
    out = Analysis()
    lim = run.limits(PROBE)
    for rank in run.ranks:
        saves = run.of_kind("save", PROBE, rank)
        loads = run.of_kind("load", PROBE, rank)
        restores = run.of_kind("load-state-dict", PROBE, rank)
        if can_resume(_script(run, rank), saves, loads, restores, run.steps_completed(rank)):
            _incomplete(run, rank, saves, lim, out)  # otherwise every save is an export of the weights
        _whole_modules(run, rank, saves, out)
        _prefixed(run, rank, saves, out)
        _unsafe(run, rank, loads, {s.get("file") for s in saves}, out)
        _mismatch(run, rank, restores, lim, out)
        _resume_empty(run, rank, out)
        _resume_scheduler(run, rank, out)
        _resume_scaler(run, rank, out)
        if rank == 0:
            out.measurements = _measurements(saves, loads, restores)
    return out


def _resume_empty(run: RunEvidence, rank: int, out: Analysis) -> None:
    """A resume whose optimizer starts empty: the restored optimizer is not the one that steps (a new one was
    built after the restore), or the checkpoint's optimizer state was never loaded while its weights were."""
    # the first judgement that holds: a run's own first step, then any resume inside the run (a later job in the
    # same process), in the order they came
    for e in run.of_kind("resume-optimizer-empty", PROBE, rank):
        if _report_resume_empty(run, rank, e, out):
            return


def _report_resume_empty(run: RunEvidence, rank: int, e: dict[str, Any], out: Analysis) -> bool:
    also: tuple[dict[str, Any] | None, str] = (None, "")
    if e.get("how") == "not-saved":
        text = _not_saved(run, rank, e)
        if text is None:
            return False
        where = e.get("model_site") or e.get("load_site")
    elif e.get("how") == "unrestored":
        # read before training from a checkpoint of the layout this run writes (the same file again, next to
        # optimizer state, in that folder or the next of its numbered series), with no optimizer state restored
        written = _written_again(e, run.of_kind("save", PROBE, rank))
        if written is None:
            return False
        load = e.get("load_site") or {}
        text = (f"the run read {e.get('file')} from {os.path.basename(str(e.get('dir') or '')) or 'a checkpoint'} "
                f"before training"
                + (f" (line {load.get('line')}, in {load.get('function')})" if load.get("line") else "")
                + f", a checkpoint of the layout this run writes itself ({written.get('file')} and the optimizer's "
                f"state into {os.path.basename(str(written.get('dir') or ''))} at step {written.get('at_step')}), but "
                f"no optimizer state{'' if e.get('model_site') else ' and no weights'} came back from it: the "
                f"{e.get('stepping_type')} took its first step with empty state, so the continued run starts its "
                "optimizer from scratch (a restore that runs before the objects it fills are registered or built "
                "restores nothing)")
        where = e.get("load_site")
    elif e.get("how") == "replaced":
        built = e.get("built_site") or {}
        text = (f"the {e.get('restored_type')} restored with load_state_dict is not the optimizer that steps: a new "
                f"{e.get('stepping_type')} was built after the restore"
                + (f" (line {built.get('line')}, in {built.get('function')})" if built.get("line") else "")
                + " and took its first step with empty state (Adam's moments, momentum buffers and step count "
                "start from zero, as in a fresh run)")
        where = built or e.get("restored_site")
        # the restore whose state was thrown away is the other half of the fix (hand that optimizer on)
        also = (e.get("restored_site"), "the optimizer restored here is not the one that steps")
    elif e.get("how") == "loaded-empty":
        # load_state_dict ran, but what it was handed held no parameter's state while the file held some
        restore = e.get("restore_site") or {}
        held = f" for {plural(e['entries'], 'parameter')}" if e.get("entries") else ""
        text = (f"the checkpoint {e.get('file') or ''} holds optimizer state{held}, but the optimizer's load_state_dict"
                + (f" (line {restore.get('line')}, in {restore.get('function')})" if restore.get("line") else "")
                + " was handed a state dict with no per-parameter state (one built from the fresh optimizer's own "
                f"state_dict() keeps only what that holds: nothing before its first step): the {e.get('stepping_type')} "
                "took its first step with empty state, so the resumed run restarts its optimizer from scratch"
                ).replace("  ", " ")
        where = e.get("restore_site") or e.get("load_site")
    elif e.get("own_file"):
        # the optimizer's state came from its own file: the line that read it and handed it to no optimizer
        load = e.get("load_site") or {}
        text = (f"the optimizer state read from {e.get('file') or 'its file'}"
                + (f" (line {load.get('line')}, in {load.get('function')})" if load.get("line") else "")
                + f" next to the restored weights was never loaded into an optimizer (no load_state_dict ran): the "
                f"{e.get('stepping_type')} took its first step with empty state, so the resumed run restarts its "
                "optimizer from scratch")
        where = e.get("load_site") or e.get("model_site")
    elif e.get("built_site"):
        # a fresh optimizer built after the weights came back (a trainer's train() after its load()): that line
        built = e["built_site"]
        text = (f"the checkpoint {e.get('file') or ''} holds optimizer state next to the weights and the weights were "
                f"restored, but the {e.get('stepping_type')} that steps was built afresh after that restore (line "
                f"{built.get('line')}, in {built.get('function')}) and no load_state_dict handed it the saved state: it "
                "took its first step with empty state, so the resumed run restarts its optimizer (and the schedule "
                "built on it) from scratch").replace("  ", " ")
        where = built
        # where the weights came back without the optimizer state next to them: the other place a fix can go
        also = (e.get("model_site"), "the weights restored here; the optimizer state next to them was not loaded")
    else:
        where = e.get("model_site") or e.get("load_site")
        # the restore code that read the checkpoint may hold the optimizer's load_state_dict behind a condition that
        # kept it from running (an option off by default, an optimizer not built yet): that is the line to change
        skipped = _skipped_restore(run, rank, [e.get("model_site"), e.get("load_site")], OPTIMIZER_WORDS)
        text = (f"the checkpoint {e.get('file') or ''} holds optimizer state next to the weights, the weights were "
                f"restored, but no optimizer's load_state_dict ran"
                + (f" (the one at line {skipped['line']}, in {skipped['function']}, was skipped)" if skipped else "")
                + f": the {e.get('stepping_type')} took its first step "
                "with empty state, so the resumed run restarts its optimizer from scratch").replace("  ", " ")
        if skipped:
            also = (where, "the weights restored here; the optimizer state next to them was not loaded")
            where = skipped
            caller = e.get("model_caller_site") or {}
            parameter = _guard_parameter(skipped["path"], skipped["line"]) if caller.get("line") else None
            if parameter is not None:
                # the condition tests an argument of the restore function (`if optimizer is not None:`): the call
                # that left that argument out is the line to change; the skipped restore is the second place
                text += (f"; the condition tests its argument `{parameter}`, which the call on line {caller['line']} "
                         f"(in {caller.get('function')}) did not give")
                also = (skipped, f"the optimizer's restore, skipped because `{parameter}` was not given")
                where = caller
    values = {"how": e.get("how"), "stepping_optimizer": e.get("stepping_type"), "step": e.get("at_step")}
    site, note = also
    second = None
    if site and site != where:
        second = [Evidence(kind="probe", source=PROBE, summary=note, location=location(run, site))]
    # A restore thrown away is certain; a checkpoint's optimizer state left unread may be a deliberate fresh start
    # (fine-tuning from a full training checkpoint): a warning.
    severity = None if e.get("how") == "replaced" else "warning"
    out.symptoms.append(run.symptom("resume-optimizer-state-missing", probe=PROBE, summary=text, values=values,
                                    location=location(run, where), step=e.get("at_step"), rank=rank,
                                    severity=severity, evidence=second))
    return True


def _not_saved(run: RunEvidence, rank: int, e: dict[str, Any]) -> str | None:
    """Weights restored from a file that holds no optimizer state, and none loaded from anywhere: a fine-tune from
    pretrained weights, or a resume from a checkpoint that left the optimizer out. A resume when the run writes that
    checkpoint again after the restore (the same file, or the next of its numbered series in the same folder), when
    the folder the weights came from holds an optimizer file nobody read (checkpoint-40/optimizer.pt), or when the
    file holds a training position and the script names the read a resume (`torch.load(args.resume)`); None
    otherwise (the text of the finding when it is one)."""
    restore = e.get("model_site") or {}
    restored = (f"the weights were restored from {e.get('file') or 'a checkpoint'}"
                + (f" (line {restore.get('line')}, in {restore.get('function')})" if restore.get("line") else ""))
    empty = (f"the {e.get('stepping_type')} took its first step{' after that restore' if e.get('mid_run') else ''} "
             "with empty state")
    after = [s for s in run.of_kind("save", PROBE, rank) if (s.get("index") or 0) > (e.get("saves_before") or 0)]
    if any(_same_checkpoint(s, e) for s in after):
        return (f"{restored}, a checkpoint this run writes again while it trains, but that checkpoint holds no "
                f"optimizer state and none was loaded from anywhere: {empty}, so every continued run restarts its "
                "optimizer from scratch (save optimizer.state_dict() in the checkpoint and load it after the weights)")
    if e.get("unread_optimizer"):
        return (f"{restored}; the optimizer state saved beside it ({e['unread_optimizer']} in "
                f"{os.path.basename(str(e.get('dir') or '')) or 'the same folder'}) was never read: {empty}, so the "
                "continued run restarts its optimizer from scratch (load that file into the optimizer after the "
                "weights)")
    if e.get("position") and _named_resume([e.get("load_site"), e.get("model_site")]):
        return (f"{restored}, a checkpoint that holds the training position (its epoch or step) and that the script "
                f"reads as a resume, but it holds no optimizer state and none was loaded from anywhere: {empty}, so "
                "the continued run restarts its optimizer from scratch (save optimizer.state_dict() with the weights "
                "and load it on resume)")
    return None


def _named_resume(sites: list[dict[str, Any] | None]) -> bool:
    """Whether the source line of a site, or the function it is in, names a resume (`torch.load(args.resume)`,
    `def resume_from(...)`)."""
    for site in sites:
        if not site or not site.get("path") or not isinstance(site.get("line"), int):
            continue
        text = linecache.getline(site["path"], site["line"]) + " " + str(site.get("function") or "")
        if RESUME_WORDS.search(text):
            return True
    return False


def _resume_scheduler(run: RunEvidence, rank: int, out: Analysis) -> None:
    """A resume whose optimizer state came back but whose schedule did not: a scheduler on the restored optimizer
    that counts again from zero (never saved or never loaded), or a restored one that drives, through a scheduler
    it holds, a copy of the optimizer pickled into its state instead of the optimizer that steps."""
    if run.of_kind("resume-optimizer-empty", PROBE, rank):
        return  # the optimizer itself started empty: that one is reported, and says the schedule restarts too
    events = run.of_kind("resume-scheduler", PROBE, rank)
    if not events:
        return
    e = events[0]
    restore, built = e.get("restore_site") or {}, e.get("built_site") or {}
    steps = None
    if e.get("how") == "fresh":
        record = _schedule_record(run, rank, e.get("scheduler_type"), built)
        if record is not None and (record.get("positioned") or (record.get("steps") or 0) < 2):
            return  # placed with step(epoch) later in the run, or hardly stepped: no schedule started over
        steps = (record or {}).get("steps")

    def at(site: dict[str, Any]) -> str:
        return f" (line {site.get('line')}, in {site.get('function')})" if site.get("line") else ""

    if e.get("how") == "stale":
        text = (f"the {e.get('scheduler_type')} was restored with load_state_dict{at(restore)}, but its state holds "
                f"its {e.get('inner')} ({e.get('inner_type')}) bound to a copy of the optimizer pickled with it: "
                f"after the restore that schedule changes the copy's learning rate, not the optimizer that steps, "
                "whose learning rate stays where the checkpoint left it (restore the nested scheduler's state into "
                "the one built on the live optimizer, or re-bind its optimizer after loading)")
    else:
        text = (f"the {e.get('restored_type')}'s state was restored{at(restore)}, but the {e.get('scheduler_type')} "
                f"that drives it{at(built)} was not: it counted {f'its {steps} steps' if steps else 'its steps'} of this "
                "run from zero, so "
                "the learning-rate schedule starts over (milestones, warm-up and decay come as many steps late as "
                "the checkpoint had taken) while the optimizer continues (save scheduler.state_dict() in the "
                "checkpoint and load it with the optimizer, or build the scheduler with last_epoch)")
    where = restore or built
    skipped = _skipped_restore(run, rank, [restore], SCHEDULER_WORDS) if e.get("how") == "fresh" else None
    if skipped:
        # the restore that brought the optimizer back has the scheduler's load_state_dict behind a condition that
        # kept it from running (verl #7953: a flag off by default): that line, not the optimizer's restore
        text = text.replace(" was not:", f" was not (its load_state_dict at line {skipped['line']}, in "
                            f"{skipped['function']}, was skipped):", 1)
        where = skipped
    second = None
    if built and built != where:
        second = [Evidence(kind="probe", source=PROBE, summary=f"the {e.get('scheduler_type')} built here",
                           location=location(run, built))]
    values = {"how": f"scheduler-{e.get('how')}", "scheduler": e.get("scheduler_type"), "step": e.get("at_step")}
    out.symptoms.append(run.symptom("resume-optimizer-state-missing", probe=PROBE, summary=text, values=values,
                                    location=location(run, where), step=e.get("at_step"), rank=rank,
                                    severity="warning", evidence=second))


OPTIMIZER_WORDS = ("optim", "opt")
SCHEDULER_WORDS = ("sched", "lr_s")


def _skipped_restore(run: RunEvidence, rank: int, sites: list[dict[str, Any] | None],
                     words: tuple[str, ...]) -> dict[str, Any] | None:
    """Where the restore code the run went through holds a `load_state_dict` of the missing state that never ran:
    in the function around each site (the weights' restore, the file's torch.load), its `X.load_state_dict(...)`
    calls that no load-state-dict event came from, the one whose receiver or argument names the state (`words`);
    the condition around it when one kept it from running. None when there is no such single call."""
    ran: dict[str, set[int]] = {}
    for r in run.of_kind("load-state-dict", PROBE, rank):
        site = r.get("site") or {}
        if site.get("path"):
            ran.setdefault(site["path"], set()).add(site.get("line"))
    for site in sites:
        if not site or not site.get("path") or not isinstance(site.get("line"), int):
            continue
        found = _unrun_loads(site["path"], site["line"], frozenset(ran.get(site["path"], set())), words)
        if found is not None:
            line, function = found
            return {"path": site["path"], "line": line, "function": function}
    return None


@lru_cache(maxsize=64)
def _unrun_loads(path: str, line: int, ran: frozenset[int], words: tuple[str, ...]) -> tuple[int, str] | None:
    """(line, function) of the single load_state_dict call naming `words` in the function around `line` of `path`
    that did not run (its enclosing `if`'s line when it has one), or None."""
    try:
        tree = ast.parse("".join(linecache.getlines(path)), filename=path)
    except (SyntaxError, ValueError):
        return None
    around = None
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.lineno <= line <= (node.end_lineno or 0):
            if around is None or node.lineno > around.lineno:
                around = node  # the innermost function around the line
    if around is None:
        return None
    lines = linecache.getlines(path)
    calls: list[tuple[int, int | None]] = []

    def visit(node: ast.AST, guards: tuple[ast.If, ...]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                continue
            inner = (*guards, child) if isinstance(child, ast.If) else guards
            if (isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute)
                    and child.func.attr == "load_state_dict"):
                span = range(child.lineno, (child.end_lineno or child.lineno) + 1)
                text = "".join(lines[n - 1] for n in span if 0 < n <= len(lines)).lower()
                if not any(n in ran for n in span) and any(w in text for w in words):
                    # the outermost condition around it that holds no restore that ran: the one that was false
                    quiet = [g for g in inner if not any(g.lineno <= n <= (g.end_lineno or g.lineno) for n in ran)]
                    calls.append((child.lineno, quiet[0].lineno if quiet else None))
            visit(child, inner)

    visit(around, ())
    if len(calls) != 1:
        return None
    call, guard = calls[0]
    return (guard or call), around.name


@lru_cache(maxsize=64)
def _guard_parameter(path: str, line: int) -> str | None:
    """The parameter of the function around `line` that the `if` on that line tests (`if optimizer is not None:`,
    `if load_optim:`), when it has a default value (a caller may leave it out); None otherwise."""
    try:
        tree = ast.parse("".join(linecache.getlines(path)), filename=path)
    except (SyntaxError, ValueError):
        return None
    around = None
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.lineno <= line <= (node.end_lineno or 0):
            if around is None or node.lineno > around.lineno:
                around = node
    if around is None:
        return None
    args = around.args
    positional = [*args.posonlyargs, *args.args]
    defaulted = {a.arg for a in positional[len(positional) - len(args.defaults):]} if args.defaults else set()
    defaulted |= {a.arg for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is not None}
    for node in ast.walk(around):
        if isinstance(node, ast.If) and node.lineno == line:
            names = [n.id for n in ast.walk(node.test) if isinstance(n, ast.Name) and n.id in defaulted]
            return names[0] if len(set(names)) == 1 else None
    return None


def _resume_scaler(run: RunEvidence, rank: int, out: Analysis) -> None:
    """A GradScaler restored with load_state_dict and then replaced: the scaler that steps was built after the
    restore, so the continued run starts again from its initial loss scale (and skips the steps that overflow on
    the way down to where the checkpoint had it)."""
    events = run.of_kind("resume-scaler", PROBE, rank)
    if not events:
        return
    e = events[0]
    restore, built = e.get("restore_site") or {}, e.get("built_site") or {}

    def at(site: dict[str, Any]) -> str:
        return f" (line {site.get('line')}, in {site.get('function')})" if site.get("line") else ""

    initial = f" of {e['scale']:g}" if e.get("scale") else ""
    text = (f"the GradScaler's state was restored with load_state_dict{at(restore)}, but the scaler that steps was "
            f"built after that restore{at(built)}: the continued run starts again from its initial loss scale{initial} "
            "and skips every step that overflows on the way back down to the scale the checkpoint held (keep the "
            "restored scaler, or build the new one before loading its state)")
    where = built or restore
    second = None
    if restore and restore != where:
        second = [Evidence(kind="probe", source=PROBE, summary="the GradScaler restored here is not the one that steps",
                           location=location(run, restore))]
    values = {"how": "scaler-replaced", "step": e.get("at_step")}
    out.symptoms.append(run.symptom("resume-optimizer-state-missing", probe=PROBE, summary=text, values=values,
                                    location=location(run, where), step=e.get("at_step"), rank=rank,
                                    severity="warning", evidence=second))


def _schedule_record(run: RunEvidence, rank: int, kind: str | None, built: dict[str, Any]) -> dict[str, Any] | None:
    """The schedule probe's last record of the scheduler of this type built at that line (its steps, and whether
    a step(epoch) positioned it), or None when the schedule probe did not see it."""
    indexes = {e.get("index") for e in run.of_kind("scheduler", "schedule", rank)
               if e.get("scheduler") == kind and (e.get("site") or {}).get("line") == built.get("line")
               and (e.get("site") or {}).get("path") == built.get("path")}
    records = [e for e in run.of_kind("scheduler-end", "schedule", rank) if e.get("index") in indexes]
    records = records or [e for e in run.of_kind("scheduler-steps", "schedule", rank) if e.get("index") in indexes]
    return records[-1] if records else None


def _written_again(read: dict[str, Any], saves: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The save of the run that writes the file `read` came from again, into the same folder or a folder of the
    same numbered series (checkpoint-24 read, checkpoint-32 written), when the run also writes optimizer state
    there and the file or its folder names a training position; None otherwise."""
    folder, name = str(read.get("dir") or ""), str(read.get("file") or "")
    if not folder or not name:
        return None
    series = {folder}
    for s in saves:
        other = str(s.get("dir") or "")
        if other and os.path.dirname(other) == os.path.dirname(folder) and _numbered_alike(
                os.path.basename(other), os.path.basename(folder)):
            series.add(other)
    positioned = bool({"step", "epoch"} & set(read.get("holds") or [])) or len(series) > 1
    same = [s for s in saves if s.get("file") == name and str(s.get("dir") or "") in series]
    with_state = [s for s in saves if "optimizer" in (s.get("holds") or []) and str(s.get("dir") or "") in series]
    if not positioned or not same or not with_state:
        return None
    return {**with_state[0], "file": name}


def _numbered_alike(a: str, b: str) -> bool:
    """Two names the same but for their numbers, and with numbers (epoch_3 and epoch_4, checkpoint-24 and -32)."""
    return bool(re.search(r"\d", a)) and re.sub(r"\d+", "#", a) == re.sub(r"\d+", "#", b)


def _same_checkpoint(save: dict[str, Any], restored: dict[str, Any]) -> bool:
    """Whether a save wrote the checkpoint the weights were restored from: the weights, into the same folder,
    under the same name or the same name with other numbers (epoch_3.pt read, epoch_4.pt written)."""
    if "model" not in (save.get("holds") or []) or not restored.get("dir") or save.get("dir") != restored.get("dir"):
        return False
    saved, read = str(save.get("file") or ""), str(restored.get("file") or "")
    return bool(read) and (saved == read or re.sub(r"\d+", "#", saved) == re.sub(r"\d+", "#", read))


def _script(run: RunEvidence, rank: int) -> str | None:
    """The path of the script the run started."""
    start = run.start(rank) or {}
    target, cwd = start.get("target"), start.get("cwd")
    if not isinstance(target, str):
        return None
    return os.path.join(cwd, target) if isinstance(cwd, str) else target


def _by_site(events: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for e in events:
        site = e.get("site") or {}
        groups.setdefault((site.get("path"), site.get("line")), []).append(e)
    return list(groups.values())


def _incomplete(run: RunEvidence, rank: int, saves: list[dict[str, Any]], lim: dict[str, Any], out: Analysis) -> None:
    final = run.steps_completed(rank)
    optional = list(lim.get("optional", ["rng"]))
    # What all the saves of one optimizer step hold together: a checkpoint written as several files (Hugging
    # Face's Trainer: the weights, optimizer.pt, scheduler.pt, rng_state.pth; a script saving the model and the
    # optimizer apart) is complete when its files are.
    together: dict[Any, set[str]] = {}
    for s in saves:
        together.setdefault(s.get("at_step"), set()).update(s.get("holds", []))
    for group in _by_site(saves):
        judged = [s for s in group if "model" in s.get("holds", []) and (
            s.get("at_step", 0) < final or len(s.get("holds", [])) >= 2)]
        if not judged:
            continue
        last = judged[-1]
        holds = last.get("holds", [])
        have = set(holds) | together.get(last.get("at_step"), set())
        have |= {"epoch", "step"} if {"epoch", "step"} & have else set()
        missing = [n for n in last.get("needed", []) if n not in have]
        if not missing:
            continue
        missing += [n for n in optional if n not in have]
        during = [s for s in judged if s.get("at_step", 0) < final]
        values = {"missing": missing, "saved": holds, "saves": len(judged), "file": last.get("file"),
                  "keys": last.get("keys", [])[:12]}
        when = (f"{plural(len(during), 'checkpoint')} written during training (at step "
                f"{', '.join(str(s.get('at_step')) for s in during[:4])}{', …' if len(during) > 4 else ''})"
                if during else f"{plural(len(judged), 'checkpoint')}")
        what = ", ".join(holds) if holds else "nothing recognisable"
        out.symptoms.append(
            run.symptom(
                "checkpoint-incomplete",
                probe=PROBE,
                summary=f"{when} to {last.get('file')} {'hold' if len(judged) > 1 else 'holds'} {what}; a resume "
                f"would also need: {', '.join(missing)}",
                values=values,
                location=location(run, last.get("site")),
                step=last.get("at_step"),
                rank=rank,
            )
        )


def _whole_modules(run: RunEvidence, rank: int, saves: list[dict[str, Any]], out: Analysis) -> None:
    for group in _by_site(saves):
        found = [s for s in group if s.get("modules")]
        if not found:
            continue
        first = found[0]
        out.symptoms.append(
            run.symptom(
                "whole-model-pickled",
                probe=PROBE,
                summary=f"torch.save pickled the object {', '.join(first['modules'][:3])} itself "
                f"({plural(len(found), 'save')} to {first.get('file')}), not its state_dict()",
                values={"modules": first["modules"][:6], "file": first.get("file"), "saves": len(found)},
                location=location(run, first.get("site")),
                step=first.get("at_step"),
                rank=rank,
            )
        )


def _prefixed(run: RunEvidence, rank: int, saves: list[dict[str, Any]], out: Analysis) -> None:
    for group in _by_site(saves):
        found = [s for s in group if s.get("prefix")]
        if not found:
            continue
        first = found[0]
        prefix = first["prefix"]
        wrapper = "torch.compile's OptimizedModule" if prefix == "_orig_mod." else "DataParallel / DistributedDataParallel"
        out.symptoms.append(
            run.symptom(
                "wrapped-state-dict-saved",
                probe=PROBE,
                summary=f"the weights saved to {first.get('file')} are all named `{prefix}…`: the state_dict of the "
                f"{wrapper} wrapper, which loads only into an identically wrapped model",
                values={"prefix": prefix, "wrapper": wrapper, "file": first.get("file")},
                location=location(run, first.get("site")),
                step=first.get("at_step"),
                rank=rank,
            )
        )


def _unsafe(run: RunEvidence, rank: int, loads: list[dict[str, Any]], written: set[Any], out: Analysis) -> None:
    for group in _by_site(loads):
        first = group[0]
        values: dict[str, Any] = {"file": first.get("file"), "loads": len(group), "at_step": first.get("at_step"),
                                  "tensors_on": first.get("devices", [])}
        reasons = []
        # A file this run wrote itself is trusted, as `check` (TD702) trusts one the script writes.
        if first.get("weights_only") is False and first.get("file") not in written:
            values["weights_only"] = False
            reasons.append("weights_only=False: unpickling can run any code the file names")
        devices = [d for d in first.get("devices", []) if d.startswith("cuda")]
        current = first.get("current_device")
        if first.get("map_location") is None and devices and current and any(d != current for d in devices):
            values.update(map_location_missing=True, devices=devices, current_device=current)
            reasons.append(f"no map_location: its tensors landed on {', '.join(devices)} while this process uses "
                           f"{current}")
        if not reasons:
            continue
        out.symptoms.append(
            run.symptom("unsafe-load", probe=PROBE, summary=f"torch.load of {first.get('file')}: " + "; ".join(reasons),
                        values=values, location=location(run, first.get("site")), step=first.get("at_step"),
                        rank=rank)
        )


def _mismatch(run: RunEvidence, rank: int, restores: list[dict[str, Any]], lim: dict[str, Any],
              out: Analysis) -> None:
    for e in restores:
        if e.get("what") != "model" or e.get("strict") or not (e.get("missing") or e.get("unexpected")):
            continue
        missing, unexpected = int(e.get("missing") or 0), int(e.get("unexpected") or 0)
        model_keys = int(e.get("model_keys") or 0)
        text = (f"load_state_dict(strict=False) into {e.get('model')} skipped {plural(missing, 'missing key')} and "
                f"{plural(unexpected, 'unexpected key')}")
        severity = None  # the catalogue's: a load that silently left the model (mostly) untrained
        if e.get("prefix"):
            text += f": they differ only by the `{e['prefix']}` prefix"
        if missing and model_keys and missing >= model_keys:
            text += " — nothing was loaded, the model keeps its initial weights"
        elif not e.get("prefix") and model_keys and (model_keys - missing) / model_keys >= float(
                lim.get("partial_load_min_loaded", 0.5)):
            # Most keys loaded: the shape of a deliberate partial load (a replaced classifier head, a new layer
            # fine-tuned from a backbone), which strict=False exists for. Still listed, so an accidental one shows.
            text += (f" — {model_keys - missing} of {model_keys} keys loaded; the skipped ones keep their initial "
                     "weights, as intended when a head or layer was replaced on purpose")
            severity = "info"
        out.symptoms.append(
            run.symptom(
                "state-dict-mismatch",
                probe=PROBE,
                summary=text,
                values={"missing_keys": e.get("missing_keys", []), "unexpected_keys": e.get("unexpected_keys", []),
                        "missing_count": missing, "unexpected_count": unexpected, "prefix": e.get("prefix"), "strict": False,
                        "model_keys": e.get("model_keys")},
                location=location(run, e.get("site")),
                step=e.get("at_step"),
                rank=rank,
                severity=severity,
            )
        )


def _measurements(saves: list[dict[str, Any]], loads: list[dict[str, Any]],
                  restores: list[dict[str, Any]]) -> dict[str, Any]:
    if not (saves or loads or restores):
        return {}
    m: dict[str, Any] = {"saves": len(saves), "loads": len(loads)}
    parts = []
    if saves:
        last = saves[-1]
        m["last_save_holds"] = last.get("holds", [])
        parts.append(f"{plural(len(saves), 'torch.save')}; the last, to {last.get('file')}, holds "
                     f"{', '.join(last.get('holds') or ['nothing recognisable'])}")
    if loads:
        parts.append(f"{plural(len(loads), 'torch.load')}")
    restored = sorted({r.get("what") for r in restores if r.get("what")})
    if restored:
        m["restored"] = restored
        parts.append("restored: " + ", ".join(restored))
    m["summary"] = "; ".join(parts)
    return m
