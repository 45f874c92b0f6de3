"""One project, many files: the pass that joins what each file told about itself.

`check` analyses every file once, on its own (in worker processes for large trees). A rule whose question
spans files — a training loop in `train.py` calling `eval_net()` from `eval.py`, a model whose class in
`model.py` ends in softmax — leaves small facts with `ctx.leave(key, value)` while it analyses a file, and
registers a `@project(code)` function that runs once, after every file, over all of them. The pass sees only
those facts, never the trees, so it costs next to nothing and the per-file analysis stays parallel.

Module names are the files' paths below the folder that was checked (`pkg/model.py` -> `pkg.model`); an import
names a module of the project when its dotted name ends like one (`from model import Net` inside `src/`).
Results depend only on the set of files, not on the order they were named in.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ProjectHit:
    """A finding the project pass makes: in which file, where, and the values of the rule's message."""

    path: str  # the display path of a file of the project
    line: int
    col: int
    values: dict[str, Any] = field(default_factory=dict)
    severity: str | None = None  # lower than the rule's own for a milder shape (Hit.severity); None: the rule's


@dataclass
class ProjectFile:
    path: str  # display path
    module: str  # dotted module name below its root
    facts: dict[str, list[Any]]


class Project:
    """Every analysed file's facts, with module names to join them by."""

    def __init__(self, files: list[ProjectFile]):
        self.files = sorted(files, key=lambda f: f.path)
        self._memo: dict[str, Any] = {}
        self._by_tail: dict[str, list[ProjectFile]] = {}
        for f in self.files:
            parts = f.module.split(".")
            for i in range(len(parts)):
                self._by_tail.setdefault(".".join(parts[i:]), []).append(f)

    def facts(self, key: str) -> Iterator[tuple[ProjectFile, Any]]:
        for f in self.files:
            for value in f.facts.get(key, ()):
                yield f, value

    def memo(self, key: str, factory: Callable[[], Any]) -> Any:
        """A table several rules' passes build from the same facts (the call sites by name), built once per project."""
        if key not in self._memo:
            self._memo[key] = factory()
        return self._memo[key]

    def any_fact(self, key: str) -> bool:
        return any(key in f.facts for f in self.files)

    def defining(self, qualified: str, below: bool = False) -> list[tuple[ProjectFile, str]]:
        """(file, local name) for a qualified name such as `eval.eval_net` or `models.unet.UNet` that one of
        the project's modules defines; several when the module's name is ambiguous. An import longer than the
        project's module names (`pl_bolts.models.ssl.Evaluator` when `ssl/` was checked) is matched by its
        longest tail that names a module. With `below`, a package's own modules count too: a class
        re-exported by `ssl/__init__.py` is defined in one of `ssl/*.py`."""
        module, _, name = qualified.rpartition(".")
        if not module or not name:
            return []
        parts = module.split(".")
        for i in range(len(parts)):
            tail = ".".join(parts[i:])
            found = list(self._by_tail.get(tail, ()))
            if below:  # the package's modules, below any tail of their names (`ssl.evaluator` for `ssl`)
                found += [f for f in self.files if f not in found and f".{tail}." in f".{f.module}"]
            if found:
                return [(f, name) for f in found]
        return []


def module_name(display: str, roots: list[str]) -> str:
    """`src/pkg/model.py` below the checked folder `src` -> `pkg.model`; `__init__.py` names its package."""
    return module_namer(roots)(display)


def module_namer(roots: list[str]) -> Callable[[str], str]:
    """`module_name` for many files under the same roots: what each root gives (its absolute path, the folder
    names are taken below) is worked out once, not once per file (a stat of every root for every file)."""
    cwd = os.getcwd()
    bases: list[tuple[str, str, str]] = []  # (absolute root, its prefix for the files below it, base folder)
    for root in roots:
        root = os.path.abspath(root)
        is_dir = os.path.isdir(root)
        base = root if is_dir else os.path.dirname(root)
        # A package folder named on the command line (`check train.py datasets/`) keeps its own name:
        # `datasets/Denoise_dataset.py` is `datasets.Denoise_dataset`, as `from datasets.Denoise_dataset
        # import ...` in train.py spells it (a module is also found by any tail of its name).
        if is_dir and root != cwd and os.path.basename(root).isidentifier():
            base = os.path.dirname(root)
        bases.append((root, root.rstrip(os.sep) + os.sep, base))

    def name(display: str) -> str:
        absolute = os.path.abspath(display)
        best = None
        for root, prefix, base in bases:
            if absolute == root or absolute.startswith(prefix):
                # the path below `base` (`os.path.relpath`'s answer: both paths are absolute and normalised, and
                # the file is below the root, which is `base` or the folder below it), cut out of the string
                rel = "." if absolute == base else absolute[len(base.rstrip(os.sep)) + 1:]
                if best is None or len(rel) < len(best):
                    best = rel
        rel = best if best is not None else os.path.basename(absolute)
        stem = os.path.splitext(rel)[0].replace(os.sep, "/")
        parts = [p for p in stem.split("/") if p and p != "."]
        if parts and parts[-1] == "__init__":
            parts = parts[:-1]
        return ".".join(parts)

    return name


def run(files: list[ProjectFile], codes: tuple[str, ...]) -> dict[str, list[ProjectHit]]:
    """Every enabled rule's project pass: rule code -> its findings."""
    from torchdoctor.rules.static import registry
    from torchdoctor.rules.static.api import PROJECT_RULES

    registry.rules()  # imports the rule families, which register their project passes
    project = Project(files)
    out: dict[str, list[ProjectHit]] = {}
    for code, fn in PROJECT_RULES:
        if code in codes:
            out.setdefault(code, []).extend(fn(project))
    return out
