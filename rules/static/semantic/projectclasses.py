"""Which classes of the project are torch modules, known before any file is analysed.

Each file is analysed on its own (in worker processes), so `model = network.coRNN(...)` in `train.py` did not
know that `network.py` defines `class coRNN(nn.Module)`, and a model built from another file of the project had
no kind. A pre-pass reads every `.py` file's class headers with a regular expression (no parse: it must cost next
to nothing beside the analysis) and hands the index the table: qualified class name -> module or not, bases
followed across files by name. The index asks it only about names it resolved through an import (or a star
import) that no table of its own knows.

The same pre-pass also reads what callers hand to functions of other files (projectcalls.py): `train(model,
loader, optimizer)` in `train.py` gives the parameters of `def train` in `engine.py` their kinds; and the
command-line options every file declares (projectoptions.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from torchdoctor.rules.static.semantic.projectoptions import ProjectOptions, declared

# `class Name(Base1, pkg.Base2, metaclass=M):`, bases over several lines too.
_CLASS = re.compile(r"^[ \t]*class[ \t]+(\w+)[ \t]*\(([^()]*(?:\([^()]*\)[^()]*)*)\)[ \t]*:", re.M)
# A base that makes a class a torch module by itself: `nn.Module`, `torch.nn.Sequential`, `pl.LightningModule`,
# `PreTrainedModel`, ... (the last part of the base's spelling).
_MODULE_BASE = re.compile(r"^(?:(?:torch\.)?nn\.[A-Z]\w*|(?:\w+\.)*(?:Module|LightningModule|PreTrainedModel|"
                          r"ModelMixin|Sequential|ModuleList|ModuleDict))$")
_NOT_MODULE_BASE = frozenset({"nn.Parameter", "torch.nn.Parameter", "nn.ParameterList", "nn.ParameterDict"})


@dataclass
class ProjectClasses:
    """The project's classes by module: which are torch modules (directly or through project bases)."""

    modules: dict[str, frozenset[str]] = field(default_factory=dict)  # dotted module -> its module classes
    # what callers in other files hand to each function's parameters (projectcalls.py), by module
    handed: dict[str, dict[str, dict[str, tuple[str, str | None, str | None]]]] = field(default_factory=dict)
    paths: dict[str, str] = field(default_factory=dict)  # a file's display path -> its dotted module name
    # what each function other files import returns, position by position (projectcalls.py), by module
    returns: dict[str, dict[str, tuple[tuple[str, str | None, str | None] | None, ...]]] = field(default_factory=dict)
    _returns_by_tail: dict[str, list[str]] | None = field(default=None, repr=False)
    # every module of the project (a file's dotted name), and its module classes whose body names a dropout or
    # batch-norm layer (directly or through a project base): train()/eval() changes what they compute
    known: frozenset[str] = field(default_factory=frozenset)
    mode_layers: dict[str, frozenset[str]] = field(default_factory=dict)
    _known_tails: set[str] = field(default_factory=set, repr=False)
    _mode_by_tail: dict[str, set[str]] = field(default_factory=dict, repr=False)
    # the command-line options every file declares, with their defaults (projectoptions.py)
    options: ProjectOptions | None = None
    _by_tail: dict[str, set[str]] = field(default_factory=dict, repr=False)  # a tail of a module's name -> classes
    _below: dict[str, set[str]] = field(default_factory=dict, repr=False)  # a package's name -> classes below it

    def __post_init__(self) -> None:
        for module, classes in self.modules.items():
            parts = module.split(".")
            for i in range(len(parts)):
                self._by_tail.setdefault(".".join(parts[i:]), set()).update(classes)
                for j in range(i + 1, len(parts)):  # `models` and `pkg.models` for `pkg.models.unet`
                    self._below.setdefault(".".join(parts[i:j]), set()).update(classes)
        for module in self.known:
            parts = module.split(".")
            for i in range(len(parts)):
                for j in range(i + 1, len(parts) + 1):  # a tail of the module, or a package above it
                    self._known_tails.add(".".join(parts[i:j]))
        for module, classes in self.mode_layers.items():
            parts = module.split(".")
            for i in range(len(parts)):
                for j in range(i + 1, len(parts) + 1):
                    self._mode_by_tail.setdefault(".".join(parts[i:j]), set()).update(classes)

    def has_module(self, module: str) -> bool:
        """`state` in `from state import training_state`: a module (or package) of this project, not a library."""
        return module.lstrip(".") in self._known_tails

    def has_mode_layers(self, qualified: str) -> bool:
        """`models.TextClassifier`: a module class of the project whose body names a dropout or batch-norm layer."""
        module, _, name = qualified.lstrip(".").rpartition(".")
        return bool(module and name) and name in self._mode_by_tail.get(module, ())

    def is_module_class(self, qualified: str) -> bool:
        """`network.coRNN`, `.models.unet.UNet`, `models.UNet` (re-exported by `models/__init__.py`): a class that
        a module of the project matching the import defines (or, for a package, one of its modules), and that is
        a torch module."""
        module, _, name = qualified.lstrip(".").rpartition(".")
        if not module or not name:
            return False
        # a module of the project by that name, or a package: `from models import UNet` with `models/unet.py`
        return name in self._by_tail.get(module, ()) or name in self._below.get(module, ())

    def handed_to(self, module: str | None, function: str) -> dict[str, tuple[str, str | None, str | None]]:
        """Parameter -> (kind, class, wrapper) that every caller of `function` (a function of `module`, or a class
        for its constructor) in another file hands in."""
        return self.handed.get(module, {}).get(function, {}) if module else {}

    def returned(self, qualified: str) -> tuple[tuple[str, str | None, str | None] | None, ...] | None:
        """`models.build_model` (as an import resolves it): the kinds the one project function of that name
        returns, position by position, or None."""
        module, _, name = qualified.lstrip(".").rpartition(".")
        if not module or not self.returns:
            return None
        if self._returns_by_tail is None:
            tails: dict[str, list[str]] = {}
            for m in self.returns:
                parts = m.split(".")
                for i in range(len(parts)):
                    for j in range(i + 1, len(parts) + 1):  # a tail of the module, or a package above it
                        tails.setdefault(".".join(parts[i:j]), []).append(m)
            self._returns_by_tail = tails
        found = [self.returns[m][name] for m in self._returns_by_tail.get(module, ()) if name in self.returns[m]]
        return found[0] if len(found) == 1 else None

    def star_module_class(self, star_modules: Iterable[str], name: str) -> bool:
        """`from models import *` then `Generator()`: a module class of one of those project modules."""
        return any(self.is_module_class(f"{m}.{name}") for m in star_modules)


def scan(text: str) -> list[tuple[str, tuple[str, ...]]]:
    """(class name, base spellings) for every class header in a source text."""
    out: list[tuple[str, tuple[str, ...]]] = []
    if "class" not in text:
        return out
    # The headers `_CLASS.finditer` finds, four times faster: a header starts a line with `class`, so the pattern is
    # tried only at the start of a line that holds the word (str.find), not at every position of the text.
    find, match = text.find, _CLASS.match
    end = 0  # where the last header ended: no header starts before it
    at = find("class")
    while at >= 0:
        start = text.rfind("\n", 0, at) + 1
        m = match(text, start) if start >= end else None
        if m is None:
            line_end = find("\n", at)
            if line_end < 0:
                break
            at = find("class", line_end + 1)
            continue
        bases = tuple(b.strip() for b in m.group(2).replace("\n", " ").split(",")
                      if b.strip() and "=" not in b)
        out.append((m.group(1), bases))
        end = m.end()
        at = find("class", end)
    return out


def build(files: Iterable[tuple[str, str]], paths: dict[str, str] | None = None) -> ProjectClasses:
    """The table from (dotted module name, source text) pairs. A base named by a project class that is a module
    makes its subclass one too, whichever file either sits in (matched by the base's last name). `paths` maps the
    files' display paths to their module names, so the engine can tell a file which module it is."""
    headers: dict[str, list[tuple[str, tuple[str, ...]]]] = {}
    texts: dict[str, str] = {}
    for module, text in files:
        headers[module] = scan(text)
        texts[module] = text
    is_module: dict[tuple[str, str], bool] = {}
    by_name: dict[str, list[tuple[str, str]]] = {}
    for module, classes in headers.items():
        for name, bases in classes:
            key = (module, name)
            is_module[key] = any(_MODULE_BASE.match(b) and b not in _NOT_MODULE_BASE for b in bases)
            by_name.setdefault(name, []).append(key)
    changed = True
    while changed:
        changed = False
        for module, classes in headers.items():
            for name, bases in classes:
                if is_module[(module, name)]:
                    continue
                for b in bases:
                    short = b.rsplit(".", 1)[-1]
                    if short != name and any(is_module[k] for k in by_name.get(short, ())):
                        is_module[(module, name)] = changed = True
                        break
    table: dict[str, set[str]] = {}
    for (module, name), yes in is_module.items():
        if yes:
            table.setdefault(module, set()).add(name)
    mode = _mode_layer_classes(texts, headers, is_module, by_name)
    classes = ProjectClasses({m: frozenset(names) for m, names in table.items()}, paths=dict(paths or {}),
                             known=frozenset(headers), mode_layers=mode)
    table = _handed(texts, classes)
    classes.handed, classes.returns = table.by_module, table.returns
    classes.options = ProjectOptions(declared(texts.values()))
    return classes


# A layer whose output depends on train()/eval(): the same words the per-file analysis reads in a class body
# (`nn.Dropout(p)`, `nn.BatchNorm2d(c)`, `F.dropout(x, p, training=self.training)`).
_MODE_LAYER = re.compile(r"Dropout|BatchNorm|\bdropout\(|\.dropout\(")
# where a class body ends: the next line that starts at column 0 with code
_COLUMN_ZERO = re.compile(r"\n[^\s#)]")


def _mode_layer_classes(texts: dict[str, str], headers: dict[str, list[tuple[str, tuple[str, ...]]]],
                        is_module: dict[tuple[str, str], bool],
                        by_name: dict[str, list[tuple[str, str]]]) -> dict[str, frozenset[str]]:
    """Module classes whose body text names a mode layer, and their subclasses across files (by base name).
    The body is read from the class's header to the next line at column 0 (a nested class reads to the end of
    its enclosing class: more text, never less). Only files that name such a layer are searched (a substring
    test first: every spelling holds "ropout" or "BatchNorm")."""
    has: dict[tuple[str, str], bool] = {}
    for module, classes in headers.items():
        text = texts[module]
        if not classes or "ropout" not in text and "BatchNorm" not in text or not _MODE_LAYER.search(text):
            continue
        for name, _bases in classes:
            if not is_module.get((module, name)):
                continue
            at = text.find("class " + name)
            while at > 0 and text[at - 1] not in "\n \t":
                at = text.find("class " + name, at + 1)
            if at < 0:
                continue
            end = _COLUMN_ZERO.search(text, at)
            if _MODE_LAYER.search(text, at, end.start() if end else len(text)):
                has[(module, name)] = True
    changed = bool(has)
    while changed:
        changed = False
        for module, classes in headers.items():
            for name, bases in classes:
                if has.get((module, name)) or not is_module.get((module, name)):
                    continue
                if any(has.get(k) for b in bases for k in by_name.get(b.rsplit(".", 1)[-1], ()) if k != (module, name)):
                    has[(module, name)] = changed = True
    table: dict[str, set[str]] = {}
    for module, name in has:
        table.setdefault(module, set()).add(name)
    return {m: frozenset(names) for m, names in table.items()}


def _handed(texts: dict[str, str], classes: ProjectClasses):
    """The second table of the pre-pass: kinds callers in other files hand to parameters (projectcalls.py)."""
    from torchdoctor.rules.static.semantic import projectcalls
    from torchdoctor.rules.static.semantic.bindings import class_kind, name_kind, wrapper_of
    from torchdoctor.rules.static.semantic.vocabulary import canonical, vocabulary

    vocab = vocabulary()
    names = vocab["names"]
    # what a qualified class builds, once per name for the whole project: files ask the same few classes
    # (`nn.Linear`, `DataLoader`) over and over, each answer a dozen prefix tests
    kinds: dict[str, str | None] = {}

    def kind_of(q: str) -> str | None:
        try:
            return kinds[q]
        except KeyError:
            kind = kinds[q] = class_kind(canonical(q), names, classes)
            return kind

    try:
        return projectcalls.build(texts.items(), kind_of, name_kind, vocab["conventional_aliases"],
                                  lambda q: wrapper_of(canonical(q), names))
    except (RecursionError, MemoryError, ValueError, IndexError, KeyError):  # a bug of ours: the files are still checked
        return projectcalls.HandedKinds()
