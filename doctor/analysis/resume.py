"""Whether a run's script can read a checkpoint back into training: the test that tells a resume checkpoint
from a weights export (a best-model file, a sampling snapshot, the final weights).

`check` asks it of the source alone (TD701, rules/static/rules/checkpointing.py: no torch.load, no
load_state_dict and no resume-like name anywhere means every save is an export). At run time we know more:
which loads ran and when. A script can resume when

- the run restored a model, an optimizer, a scheduler or a scaler, or called torch.load, before its last
  optimizer step (training went on from what it loaded);
- the run restored an optimizer's state at any time (only a resume needs it);
- its source names a resume (`args.resume`, `start_epoch`, `load_checkpoint(...)`, "--resume");
- its source has a torch.load or load_state_dict call that did not run: a path this run did not take
  (`if args.resume: ...`);
- the file is named as a checkpoint (`checkpoint.pt`, `last.ckpt`): the author meant it to be one;
- the author names it a checkpoint where it is written, and writes it again and again as training goes on: a
  save site that ran at two optimizer steps or more before the last, whose folder (`checkpoints/step=16.pth`) or
  whose call's own names (`torch.save(checkpoint, checkpoint_path)`) say checkpoint (a Lightning callback writing
  `{'step', 'model'}` every N steps: bytedance/music_source_separation#20); not a file named as the best model,
  an export kept whenever the score improves;
- or a save holds an optimizer's, a scheduler's or a scaler's state (a checkpoint helper writing `backbone.pt`
  and `scheduler.pt` side by side): nothing but a resume reads those back.

A load after the last step (`model.load_state_dict(torch.load("best.pt"))` to evaluate the best weights) is
no resume. Reads the source through linecache, never executes it.
"""

from __future__ import annotations

import ast
import linecache
import os
import re
from functools import lru_cache
from typing import Any

# the words of check's TD701 (rules/static/rules/checkpointing.py), plus the command-line flag's spelling
RESUME_WORDS = re.compile(r"resume|restore|start_epoch|load_checkpoint|from_checkpoint|continue_from", re.I)
CHECKPOINT_NAME = re.compile(r"checkpoint|ckpt|resume", re.I)
BEST_NAME = re.compile(r"best", re.I)  # a best-model file: an export kept whenever the score improves
# state a save can hold that only a resumed training run reads back (probes/checkpoint.py's kinds)
TRAINING_STATE = frozenset({"optimizer", "scheduler", "scaler"})


@lru_cache(maxsize=32)
def _source_facts(path: str) -> tuple[bool, frozenset[int]]:
    """(whether the file names a resume, the lines of its torch.load / load_state_dict calls)."""
    try:
        tree = ast.parse("".join(linecache.getlines(path)), filename=path)
    except (SyntaxError, ValueError):
        return False, frozenset()
    names_resume = False
    lines: set[int] = set()
    for node in ast.walk(tree):
        text = None
        if isinstance(node, ast.Name):
            text = node.id
        elif isinstance(node, ast.Attribute):
            text = node.attr
            if node.attr == "load_state_dict" or (
                    node.attr == "load" and isinstance(node.value, ast.Name) and node.value.id == "torch"):
                lines.add(node.lineno)
        elif isinstance(node, ast.arg):
            text = node.arg
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) < 64:
            text = node.value
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            text = node.name
        if text and RESUME_WORDS.search(text):
            names_resume = True
    return names_resume, frozenset(lines)


def can_resume(script: str | None, saves: list[dict[str, Any]], loads: list[dict[str, Any]],
               restores: list[dict[str, Any]], final_step: int) -> bool:
    """Whether the script can read its checkpoints back into training (see the module docstring)."""
    if any(CHECKPOINT_NAME.search(str(s.get("file") or "")) for s in saves):
        return True
    if any(TRAINING_STATE & set(s.get("holds") or []) for s in saves):
        return True
    if _named_where_written(saves, final_step):
        return True
    if any(r.get("what") == "optimizer" for r in restores):
        return True
    if any((e.get("at_step") or 0) < final_step for e in [*loads, *restores]):
        return True
    ran: dict[str, set[int]] = {}
    for e in [*loads, *restores]:
        site = e.get("site") or {}
        if site.get("path"):
            ran.setdefault(site["path"], set()).add(site.get("line"))
    paths = {(s.get("site") or {}).get("path") for s in saves} | set(ran) | {script}
    for path in sorted(p for p in paths if p and os.path.isfile(p)):
        names_resume, load_lines = _source_facts(path)
        if names_resume or load_lines - ran.get(path, set()):
            return True
    return False


def _named_where_written(saves: list[dict[str, Any]], final_step: int) -> bool:
    """A save site that ran at two optimizer steps or more during training, whose folder or call names a checkpoint
    (and whose file is not the best model's)."""
    steps: dict[tuple, set[Any]] = {}
    for s in saves:
        site = s.get("site") or {}
        if site.get("path") and (s.get("at_step") or 0) < final_step and not BEST_NAME.search(str(s.get("file") or "")):
            steps.setdefault((site["path"], site.get("line"), s.get("dir")), set()).add(s.get("at_step"))
    for (path, line, folder), at in steps.items():
        if len(at) < 2:
            continue
        parts = [p for p in str(folder or "").replace("\\", "/").split("/") if p][-2:]
        if any(CHECKPOINT_NAME.search(p) for p in parts):
            return True
        if os.path.isfile(path) and isinstance(line, int) and line in _save_call_names(path):
            return True
    return False


@lru_cache(maxsize=32)
def _save_call_names(path: str) -> frozenset[int]:
    """The lines of the file's `*.save(...)` calls whose arguments name a checkpoint (a variable, an attribute,
    a string: `torch.save(checkpoint, checkpoint_path)`, `torch.save(state, self.ckpt_dir / name)`)."""
    try:
        tree = ast.parse("".join(linecache.getlines(path)), filename=path)
    except (SyntaxError, ValueError):
        return frozenset()
    lines: set[int] = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "save"):
            continue
        for arg in [*node.args, *(k.value for k in node.keywords)]:
            for sub in ast.walk(arg):
                text = (sub.id if isinstance(sub, ast.Name) else sub.attr if isinstance(sub, ast.Attribute)
                        else sub.value if isinstance(sub, ast.Constant) and isinstance(sub.value, str) else None)
                if text and CHECKPOINT_NAME.search(text):
                    lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return frozenset(lines)

