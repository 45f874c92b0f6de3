"""What callers in other files hand to a function's parameters, and what a function returns to other files, known
before any file is analysed.

Each file is analysed on its own, so `def train(config, train_loader, model, criterion, optimizer, epoch)` in
`lib/core/function.py` knew its parameters only by their names: the model, optimizer and loader are built in
`train.py`, which calls it. And `model, criterion = build_model(args)` knew nothing of what `build_model` in
`models/__init__.py` returns. This pre-pass reads the text of every `.py` file with regular expressions (no parse,
like the class-header pass in projectclasses.py):

- each file's imports, its module-level `def`s and classes (signatures and bodies are read only for what another
  file imports or calls);
- each file's plain assignments `name = Callee(...)` whose callee is a class of a known kind (a DataLoader, an
  optimizer, a scheduler, a torch.nn or project module class, a DDP wrapper), resolved through the file's imports,
  and `a, b = factory(...)` of another file's function whose returns are known;
- what each imported function returns, position by position: a constructor's value, or a name its body binds to one;
- each call, in another file, of a function or class of the project that the calling file imports, with the
  arguments that are plain names (`model`, `self.optimizer`).

A parameter gets a kind when every caller that hands in a name of known kind hands in the same kind, and no
caller hands in a name that says another kind (`loader` where another caller passes a model). Names are
file-wide in the index, so a parameter name that two functions of one file share must agree too. The index asks
the tables only for parameters its own file binds nothing to (bindings.py, `_bind_handed`) and for calls of
imported functions no other table knows (`_classify`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

# `from pkg.mod import a, b as c` (also parenthesised over several lines) and `import pkg.mod as m`, in one scan.
_IMPORTS = re.compile(r"\n[ \t]*(?:from[ \t]+([.\w]+)[ \t]+import[ \t]+(\([^)]*\)|[^\n#;]+)|import[ \t]+([^\n#;]+))")
# module-level `def name(` and `class Name`
_TOP = re.compile(r"\n(def|class)[ \t]+(\w+)")
# a line that starts at column 0 (code, not a comment or a closing bracket): where a top-level block ends. Searched
# from the newline before it, not as `^` in MULTILINE mode, which is tried at every character of the block.
_COLUMN_ZERO = re.compile(r"\n[^\s#)]")
_INIT = re.compile(r"^([ \t]+)def[ \t]+__init__[ \t]*\(", re.M)
# `name = Callee(`, `self.name: T = mod.Callee(`: a plain assignment of a call's value. (The patterns of whole lines start with the newline before them, a literal the search skips ahead to: `^` in
# MULTILINE mode is tried at every character.) An assignment is found by its `= Callee(` (a callee whose last part
# is capitalised: only classes have kinds), then its target is read back on its line.
# (Possessive: a dotted name is never given back part by part, as no shorter one can be followed by `(`: most `=` of
# a file are followed by a name that fails, and backtracking through it was a third of the search.)
_ASSIGNED = re.compile(r"=[ \t]*+((?:[A-Za-z_]\w*+\.)*+[A-Z]\w*+)[ \t]*+\(")
_CALLED = re.compile(r"=[ \t]*+(\w++(?:\.\w++)*+)[ \t]*+\(")  # `= build_model(`, `= models.build(`
_TARGET = re.compile(r"[ \t]*((?:self\.)?\w+)[ \t]*(?::[^=\n]+)?")
_PLAIN = re.compile(r"(?:self\.)?[A-Za-z_]\w*")
# A sampler built for a fixed order (`DistributedSampler(val_set, shuffle=False)`): what a factory returns then is
# no shuffling sampler, and a rule that asks for `set_epoch` must not be told it is one.
_NO_SHUFFLE = re.compile(r"\bshuffle[ \t]*=[ \t]*False\b")
_KEYWORD = re.compile(r"([A-Za-z_]\w*)[ \t]*=(?!=)")
_SKIP = frozenset({"self", "cls"})

Kind = tuple[str, str | None, str | None]  # (kind, class, wrapper)


@dataclass
class _Signature:
    params: list[str]  # positional parameters in order (`self` dropped for a constructor)
    keywords: frozenset[str]  # every parameter a keyword can name


@dataclass
class _File:
    module: str
    text: str
    imports: dict[str, str] = field(default_factory=dict)  # local name -> qualified name
    defs: dict[str, int] = field(default_factory=dict)  # module-level function -> offset after its name
    classes: dict[str, int] = field(default_factory=dict)  # module-level class -> offset after its name
    _signatures: dict[str, _Signature | None] = field(default_factory=dict)

    def signature(self, name: str) -> _Signature | None:
        """A function's parameters, or a class's constructor's; read only for what another file calls."""
        if name not in self._signatures:
            sig = None
            if name in self.defs:
                at = self.text.find("(", self.defs[name])
                sig = _signature(self.text, at, bound=False) if at >= 0 else None
            elif name in self.classes:
                start = self.text.find("\n", self.classes[name]) + 1  # the lines after the class's header
                body = self.text[start:_block_end(self.text, start - 1)] if start > 0 else ""
                init = _INIT.search(body)
                if init is not None:
                    sig = _signature(body, init.end() - 1, bound=True)
            self._signatures[name] = sig
        return self._signatures[name]


def _block_end(text: str, newline: int) -> int:
    """Where the block whose lines follow the newline at `newline` ends: the start of the next line at column 0,
    or the end of the text."""
    top = _COLUMN_ZERO.search(text, newline)
    return top.start() + 1 if top is not None else len(text)


def _close(text: str, start: int) -> int:
    """The index just past the parenthesis that closes the one at `start`, skipping strings; -1 if unbalanced."""
    depth = 0
    i = start
    quote = ""
    n = len(text)
    while i < n:
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 2
                continue
            if text.startswith(quote, i):
                i += len(quote)
                quote = ""
                continue
        elif ch in "\"'":
            quote = ch * 3 if text.startswith(ch * 3, i) else ch
            i += len(quote)
            continue
        elif ch == "#":
            end = text.find("\n", i)
            i = n if end < 0 else end
            continue
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return -1


def _split(inner: str) -> list[str]:
    """Top-level comma-separated parts of an argument or parameter list."""
    if "," not in inner:  # one part (most `return` values): no character needs reading
        inner = inner.strip()
        return [inner] if inner else []
    parts, depth, quote, start, i = [], 0, "", 0, 0
    while i < len(inner):
        ch = inner[i]
        if quote:
            if ch == "\\":
                i += 2
                continue
            if ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(inner[start:i])
            start = i + 1
        i += 1
    parts.append(inner[start:])
    return [p.strip() for p in parts if p.strip()]


def _signature(text: str, open_at: int, bound: bool) -> _Signature | None:
    end = _close(text, open_at)
    if end < 0:
        return None
    params: list[str] = []
    keywords: set[str] = set()
    positional = True
    for part in _split(text[open_at + 1:end - 1]):
        if part == "/":
            continue
        if part.startswith("*"):
            positional = False  # `*args` or a bare `*`: what follows is named only
            continue
        name = re.match(r"\w+", part)
        if name is None:
            return None
        keywords.add(name.group())
        if positional:
            params.append(name.group())
    if bound and params and params[0] in _SKIP:
        params = params[1:]
    return _Signature(params, frozenset(keywords))


def _relative(module: str, spelled: str) -> str:
    """`.utils` imported by `pkg.train` -> `pkg.utils` (a tail is enough: modules are matched by any tail)."""
    dots = len(spelled) - len(spelled.lstrip("."))
    if not dots:
        return spelled
    base = module.split(".")[: max(0, len(module.split(".")) - dots)]
    rest = spelled.lstrip(".")
    return ".".join([*base, rest] if rest else base)


def _lines_with(text: str, word: str, pattern: re.Pattern[str], start: int = 0,
                stop: int | None = None) -> Iterable[re.Match[str]]:
    """`pattern.finditer(text, start, stop)` for a pattern that starts at a newline and needs `word` on that line,
    several times faster: a pattern starting with a newline is tried at every line of the text, this only at the
    lines that hold the word (str.find), in order, none inside the previous match (as finditer)."""
    find, match = text.find, pattern.match
    stop = len(text) if stop is None else stop
    done = start  # no match starts before it: the start, then the end of the last match
    at = find(word, start, stop)
    while at >= 0:
        line = text.rfind("\n", 0, at)
        m = match(text, line, stop) if line >= done else None
        if m is not None:
            done = m.end()
            yield m
            at = find(word, done, stop)
            continue
        line_end = find("\n", at, stop)
        if line_end < 0:
            return
        at = find(word, line_end, stop)
    return


def _read(module: str, text: str) -> _File:
    f = _File(module, text)
    lines = "\n" + text  # offsets below are one past the text's own
    for m in _lines_with(lines, "import", _IMPORTS):
        if m.group(1) is not None:
            source = _relative(module, m.group(1))
            for part in m.group(2).strip("()").replace("\n", " ").split(","):
                words = part.split()
                if not words or words[0] == "*":
                    continue
                local = words[2] if len(words) == 3 and words[1] == "as" else words[0]
                f.imports[local] = f"{source}.{words[0]}" if source else words[0]
            continue
        for part in m.group(3).split(","):
            words = part.split()
            if len(words) == 3 and words[1] == "as":
                f.imports[words[2]] = words[0]
            elif words:
                f.imports.setdefault(words[0].split(".")[0], words[0].split(".")[0])
    for m in _TOP.finditer(lines):
        if m.group(1) == "def":
            f.defs.setdefault(m.group(2), m.end() - 1)
        else:
            f.classes.setdefault(m.group(2), m.end() - 1)
    return f


def _qualify(f: _File, spelled: str, aliases: dict[str, str]) -> str:
    root, _, rest = spelled.partition(".")
    base = f.imports.get(root) or aliases.get(root)
    if base is None:
        return f"{f.module}.{spelled}" if f.module else spelled  # a class of this file
    return f"{base}.{rest}" if rest else base


_ROOTS: dict[str, re.Pattern[str]] = {}  # a called name -> the pattern of its calls (`train(`, `utils.train(`)


def _calls(text: str, spellings: dict[str, tuple[str, str]]) -> Iterable[tuple[str, list[str]]]:
    """(callee spelling, argument list) for every call of one of `spellings` (`train`, `core.train`) in a text,
    definitions left out. A pattern per imported name, starting with its letters so the search skips ahead to
    them; only the calls asked about have their arguments read."""
    for root in {spelled.split(".", 1)[0] for spelled in spellings}:
        pattern = _ROOTS.get(root)
        if pattern is None:
            pattern = _ROOTS[root] = re.compile(re.escape(root) + r"(\.[A-Za-z_]\w*)?[ \t]*\(")
        for m in pattern.finditer(text):
            if m.start() and (text[m.start() - 1].isalnum() or text[m.start() - 1] in "_."):
                continue  # `_train(`, `self.train(`: another name
            spelled = root + (m.group(1) or "")
            if spelled not in spellings:
                continue
            line_start = text.rfind("\n", 0, m.start()) + 1
            if text[line_start:m.start()].strip() in ("def", "class", "async def"):
                continue
            end = _close(text, m.end() - 1)
            if end > 0:
                yield spelled, _split(text[m.end():end - 1])


@dataclass
class HandedKinds:
    """Module -> function (or class, for its constructor) -> parameter -> (kind, class, wrapper); and module ->
    function -> what it returns, position by position."""

    by_module: dict[str, dict[str, dict[str, Kind]]] = field(default_factory=dict)
    returns: dict[str, dict[str, tuple[Kind | None, ...]]] = field(default_factory=dict)


def build(files: Iterable[tuple[str, str]], class_kind: Callable[[str], str | None],
          name_kind: Callable[[str], str | None], aliases: dict[str, str],
          wrapper_of: Callable[[str], str | None]) -> HandedKinds:
    """The table from (dotted module name, source text) pairs. `class_kind` says what a qualified class builds,
    `name_kind` what a name says it holds (`train_loader`), `wrapper_of` which wrapper a class is (ddp, dp)."""
    read = {module: _read(module, text) for module, text in files}
    by_tail: dict[str, list[str]] = {}
    below: dict[str, set[str]] = {}  # a package's name (any tail of it) -> the modules below it
    for module in read:
        parts = module.split(".")
        for i in range(len(parts)):
            by_tail.setdefault(".".join(parts[i:]), []).append(module)
            for j in range(i + 1, len(parts)):
                below.setdefault(".".join(parts[i:j]), set()).add(module)
    handed: dict[tuple[str, str, str], set[Kind] | None] = {}
    # a name -> the modules that define it at their top level: an import is resolved by testing the few files
    # that define its name, not by asking every module below a package (torch's 520 files below `torch`)
    definers: dict[str, set[str]] = {}
    for module, f in read.items():
        for name in (*f.defs, *f.classes):
            definers.setdefault(name, set()).add(module)
    wanted = {m: _wanted(f, by_tail, below, definers, read) for m, f in read.items()}
    returns: dict[tuple[str, str], tuple[Kind | None, ...] | None] = {}  # (module, function) another file imports
    for targets in wanted.values():
        for module, name in targets.values():
            if (module, name) not in returns and name in read[module].defs:
                returns[(module, name)] = _returns(read[module], name, class_kind, aliases, wrapper_of)
    kinds: dict[str, dict[str, Kind | None]] = {}
    for m, f in read.items():
        if not wanted[m]:
            kinds[m] = {}  # a file that calls no function of another file hands nothing: its names are not read
            continue
        factories = {spelled: made for spelled, target in wanted[m].items() if (made := returns.get(target))}
        kinds[m] = _kinds(f, class_kind, aliases, wrapper_of, None, factories)
    # First the files that build an object of a known kind: only they can give a parameter one. Then the others,
    # whose names can only say another kind, for the functions the first files gave kinds to.
    for m, f in read.items():
        if any(k is not None for k in kinds[m].values()) and wanted[m]:
            _scan(f, wanted[m], kinds[m], read, handed, name_kind)
    given = {(module, function) for module, function, _ in handed}
    for m, f in read.items():
        if not any(k is not None for k in kinds[m].values()):
            asked = {spelled: target for spelled, target in wanted[m].items() if target in given}
            if asked:
                _scan(f, asked, kinds[m], read, handed, name_kind)
    table: dict[str, dict[str, dict[str, Kind]]] = {}
    per_name: dict[tuple[str, str], set[str]] = {}
    for (module, function, param), kinds in handed.items():
        if kinds is None:
            per_name.setdefault((module, param), set()).add("?")
            continue
        real = {k for k in kinds if not k[0].startswith("?")}
        per_name.setdefault((module, param), set()).update(k[0].lstrip("?") for k in kinds)
        if not real:
            continue  # only names that say a kind: the index reads names itself
        classes, wrappers = {k[1] for k in real}, {k[2] for k in real}
        kind = (next(iter(real))[0], classes.pop() if len(classes) == 1 else None,
                wrappers.pop() if len(wrappers) == 1 else None)
        table.setdefault(module, {}).setdefault(function, {})[param] = kind
    for module, functions in table.items():  # names are file-wide: a parameter name shared must agree
        for function in functions:
            for param in list(functions[function]):
                if len(per_name[(module, param)]) > 1:
                    del functions[function][param]
    made: dict[str, dict[str, tuple[Kind | None, ...]]] = {}
    for (module, name), kind in returns.items():
        if kind is not None:
            made.setdefault(module, {})[name] = kind
    return HandedKinds({m: {fn: ps for fn, ps in fns.items() if ps} for m, fns in table.items()}, made)


def _wanted(f: _File, by_tail: dict[str, list[str]], below: dict[str, set[str]], definers: dict[str, set[str]],
            read: dict[str, _File]) -> dict[str, tuple[str, str]]:
    """Callee spelling in this file -> (module, function or class) of another file it names through an import."""
    wanted: dict[str, tuple[str, str]] = {}
    for local, qualified in f.imports.items():
        target = _defined(qualified, by_tail, below, definers, f.module)
        if target is not None:
            wanted[local] = target
            continue
        modules = [m for m in by_tail.get(qualified, []) if m != f.module]
        if len(modules) == 1:  # `import utils` then `utils.train(...)`
            for name in [*read[modules[0]].defs, *read[modules[0]].classes]:
                wanted[f"{local}.{name}"] = (modules[0], name)
    return wanted


def _scan(f: _File, wanted: dict[str, tuple[str, str]], kinds: dict[str, Kind | None], read: dict[str, _File],
          handed: dict[tuple[str, str, str], set[Kind] | None], name_kind: Callable[[str], str | None]) -> None:
    for spelled, args in _calls(f.text, wanted):
        module, name = wanted[spelled]
        sig = read[module].signature(name)
        if sig is not None:
            _hand(kinds, sig, args, (module, name), handed, name_kind)


def _kinds(f: _File, class_kind: Callable[[str], str | None], aliases: dict[str, str],
           wrapper_of: Callable[[str], str | None], span: tuple[int, int] | None = None,
           factories: dict[str, tuple[Kind | None, ...]] | None = None) -> dict[str, Kind | None]:
    """What each name of a file (or of the span of one function) holds, from its plain assignments of a
    constructor's value or of what a factory of another file returns (file-wide, as the index keys names): None where
    two assignments build different kinds."""
    kinds: dict[str, Kind | None] = {}
    text = f.text
    start, end = span if span is not None else (0, len(text))

    def add(name: str, kind: Kind) -> None:
        before = kinds.get(name, (kind[0], None, None))
        if before is None or before[0] != kind[0]:
            kinds[name] = None
            return
        # A wrapper keeps the class of what it wraps (`model = DDP(model)` after `model = Net()`).
        kinds[name] = (kind[0], before[1] if kind[2] else kind[1], kind[2] or before[2])

    if factories:  # `model = build_model(cfg)`, `model, criterion = build(args)` with `build` of another file
        # every `= name(` read once, its name looked up (not a pattern of the file's factories compiled per file)
        for m in _CALLED.finditer(text, start, end):
            if m.group(1) not in factories or m.start() and text[m.start() - 1] in "=!<>":
                continue
            line = text[text.rfind("\n", 0, m.start()) + 1:m.start()].strip()
            names = [n.strip() for n in line.strip("()[]").split(",")]
            returned = factories[m.group(1)]
            if len(names) != len(returned) or not all(_PLAIN.fullmatch(n) for n in names):
                continue
            for name, kind in zip(names, returned, strict=True):
                if kind is not None:
                    add(name, kind)
    for m in _ASSIGNED.finditer(text, start, end):
        if m.start() and text[m.start() - 1] in "=!<>":
            continue  # `==`, `!=`, `<=`, `>=`
        target = _TARGET.fullmatch(text, text.rfind("\n", 0, m.start()) + 1, m.start())
        if target is None:
            continue  # a keyword argument, a subscript, a tuple: not a plain name
        name, callee = target.group(1), m.group(1)
        if callee.rsplit(".", 1)[-1] in ("to", "cuda", "cpu", "float", "half", "train", "eval"):
            continue  # `model = model.to(device)`: the same object
        q = _qualify(f, callee, aliases)
        kind = class_kind(q)
        if kind == "sampler" and _NO_SHUFFLE.search(text, m.end(), max(m.end(), _close(text, m.end() - 1))):
            continue  # a fixed-order sampler: not one that needs set_epoch
        if kind is not None:
            add(name, (kind, q, wrapper_of(q)))
    return kinds


_RETURN = re.compile(r"\n[ \t]+return[ \t]+([^\n#;]+)")
_BUILT = re.compile(r"((?:[A-Za-z_]\w*\.)*[A-Z]\w*)[ \t]*\(.*", re.S)
_SAME = re.compile(r"(\w+)(?:\.(?:to|cuda|cpu|float|half|train|eval)\([^()]*\))+")


def _returns(f: _File, name: str, class_kind: Callable[[str], str | None], aliases: dict[str, str],
             wrapper_of: Callable[[str], str | None]) -> tuple[Kind | None, ...] | None:
    """What a module-level function returns, position by position (`return model, criterion`): the kind of a
    constructor's value (`return Net(...)`) or of a name its body binds to one (`model = Net(); return model`).
    Every `return` must agree; None when nothing is known."""
    text = f.text
    start = f.defs[name]
    line_end = text.find("\n", start)
    end = _block_end(text, line_end) if line_end >= 0 else len(text)
    found: list[tuple[Kind | None, ...]] = []
    local: dict[str, Kind | None] | None = None
    for m in _lines_with(text, "return", _RETURN, start, end):
        expr = m.group(1).strip()
        if expr.startswith("(") and expr.endswith(")") and _close(expr, 0) == len(expr):
            expr = expr[1:-1]
        kinds: list[Kind | None] = []
        for part in _split(expr):
            built = _BUILT.fullmatch(part)
            same = _SAME.fullmatch(part)
            if built is not None and _close(part, part.index("(")) == len(part):
                q = _qualify(f, built.group(1), aliases)
                kind = class_kind(q)
                if kind == "sampler" and _NO_SHUFFLE.search(part):
                    kind = None  # a fixed-order sampler: not one that needs set_epoch
                kinds.append((kind, q, wrapper_of(q)) if kind is not None else None)
            elif _PLAIN.fullmatch(part) or same is not None:
                if local is None:
                    local = _kinds(f, class_kind, aliases, wrapper_of, (start, end))
                kinds.append(local.get(same.group(1) if same is not None else part))
            else:
                kinds.append(None)
        found.append(tuple(kinds))
    if not found or len({len(k) for k in found}) != 1:
        return None
    merged = tuple(k[0] if all(x[i] == k[0] for x in found) else None for i, k in enumerate(zip(*found, strict=True)))
    return merged if any(k is not None for k in merged) else None


def _defined(qualified: str, by_tail: dict[str, list[str]], below: dict[str, set[str]],
             definers: dict[str, set[str]], here: str) -> tuple[str, str] | None:
    """(module, name) of the one project function or class `pkg.core.train` names, defined in another file (also
    through a package's re-export: `from core import train` with `core/function.py`)."""
    module, _, name = qualified.rpartition(".")
    if not module:
        return None
    owners = definers.get(name)
    if not owners:
        return None
    found = [m for m in by_tail.get(module, []) if m != here and m in owners]
    if not found:
        under = below.get(module, set())
        found = [m for m in owners if m != here and m in under]
    return (found[0], name) if len(found) == 1 else None


def _hand(kinds: dict[str, Kind | None], sig: _Signature, args: list[str], target: tuple[str, str],
          handed: dict[tuple[str, str, str], set[Kind] | None], name_kind: Callable[[str], str | None]) -> None:
    """Record the kinds one call hands to each parameter of `target`."""
    passed: list[tuple[str, str]] = []
    for i, arg in enumerate(args):
        if arg.startswith("*"):
            if arg.startswith("**"):
                continue
            break  # `*args`: the positions after it are unknown
        m = _KEYWORD.match(arg)
        if m is not None:
            if m.group(1) in sig.keywords:
                passed.append((m.group(1), arg[m.end():].strip()))
        elif i < len(sig.params):
            passed.append((sig.params[i], arg))
    for param, value in passed:
        key = (*target, param)
        if not _PLAIN.fullmatch(value):
            continue
        if value in kinds and kinds[value] is None:
            handed[key] = None  # the caller's own assignments disagree: what it hands in is unknown
            continue
        kind = kinds.get(value)
        said = kind[0] if kind is not None else name_kind(value)
        if said is None:
            continue
        seen = handed.get(key, set())
        if seen is None:
            continue
        if any(k[0].lstrip("?") != said for k in seen):
            handed[key] = None  # callers disagree, by what they built or by what their names say
            continue
        handed[key] = seen | {kind if kind is not None else ("?" + said, None, None)}
