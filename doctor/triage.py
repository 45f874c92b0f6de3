"""Text triage: a user's sentence or a pasted error -> symptoms, contexts, or one question.

Two readers, both driven by data in `rules/data/`:

- error signatures (`signatures.toml`): messages as PyTorch, CUDA, NCCL,
  dynamo and the DataLoader print them. A signature is only tried when its
  literal `needle` is in the text, and its regular expression is compiled on
  first use, so a sentence costs one substring test per signature. A whole
  log is first cleaned of glog and `[rankN]:` prefixes, then read for its
  most telling line (highest priority, then the last exception), not its
  first.
- free text (`phrases.toml`): concepts (synonym sets) matched on normalised
  tokens — lower case, plurals folded, contractions joined, stretched letters
  squeezed, one-letter typos forgiven, negated mentions ("no OOM but ...")
  dropped — and patterns that combine concepts into symptoms and contexts.

When neither finds a symptom with enough confidence, triage returns ONE
clarifying question instead of a guess.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

from torchdoctor.clip import clip
from torchdoctor.model import Choice, Evidence, Location, Question, Symptom
from torchdoctor.rules import catalog

ACCEPT = 0.5  # a symptom below this score is not routed on
PROSE_LIMIT = 4000  # characters of a pasted log's own prose read as a description
_OWN_WORDS = 3  # words of the user's own beside an error that make it a report about their code


@dataclass
class Triage:
    kind: str  # error | description | ambiguous
    symptoms: list[Symptom] = field(default_factory=list)
    contexts: list[str] = field(default_factory=list)
    question: Question | None = None
    telling_line: str | None = None


class _LazyRe:
    """A regular expression compiled on first use: `ask` on a sentence never needs the log ones."""

    def __init__(self, pattern: str, flags: int = 0):
        self.pattern, self.flags, self._rx = pattern, flags, None

    def __getattr__(self, name: str) -> Any:
        if self._rx is None:
            self._rx = re.compile(self.pattern, self.flags)
        return getattr(self._rx, name)


# ---------------------------------------------------------------------------
# Logs: ANSI codes, glog and rank prefixes

_ANSI = _LazyRe(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
# torchrun / accelerate per-rank prefixes: "[rank1]:", "[default0]:", "[1,3]<stdout>:"
_RANK_PREFIX = _LazyRe(r"^\s*(?:\[\d+\] )?\[(?:rank|default)(\d+)\]: ?|^\[\d+,(\d+)\]<std(?:out|err)>:")
# glog (Python logging in torch._logging) and c10 logging prefixes, with dynamo's frame and artifact tags
_LOG_PREFIX = _LazyRe(
    r"^\[?[IWEVF](?:\d{3,4} \d\d:\d\d:\d\d\.\d+(?: +\d+)?)? [^\]\s]+:\d+\] ?"
    r"(?:\[\d+/\d+(?:_\d+)?\] ?)?(?:\[__\w+\] ?)?"
)


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text) if "\x1b" in text else text


class Log:
    """A pasted text with its per-line prefixes removed, remembering each line's rank."""

    __slots__ = ("text", "ranks", "prefixed", "line_starts")

    def __init__(self, text: str, ranks: dict[int, int], prefixed: set[int], line_starts: list[int]):
        self.text = text
        self.ranks = ranks  # line number -> rank from a prefix
        self.prefixed = prefixed  # line numbers that carried a log or rank prefix
        self.line_starts = line_starts

    def line_of(self, pos: int) -> int:
        from bisect import bisect_right

        return bisect_right(self.line_starts, pos) - 1


def clean_log(text: str) -> Log:
    text = strip_ansi(text)
    if "[" not in text and "]" not in text:  # a sentence: nothing to strip
        return Log(text, {}, set(), _line_starts(text))
    lines = text.split("\n")
    ranks: dict[int, int] = {}
    prefixed: set[int] = set()
    for n, line in enumerate(lines):
        m = _RANK_PREFIX.match(line)
        if m:
            ranks[n] = int(m.group(1) or m.group(2))
            line = line[m.end() :]
            prefixed.add(n)
        m = _LOG_PREFIX.match(line)
        if m:
            line = line[m.end() :]
            prefixed.add(n)
        lines[n] = line
    cleaned = "\n".join(lines)
    return Log(cleaned, ranks, prefixed, _line_starts(cleaned))


def _line_starts(text: str) -> list[int]:
    starts = [0]
    pos = text.find("\n")
    while pos != -1:
        starts.append(pos + 1)
        pos = text.find("\n", pos + 1)
    return starts


# ---------------------------------------------------------------------------
# Vocabulary (phrases.toml)

_TOKEN = _LazyRe(r"[a-z0-9]+%?")
_STRETCH = _LazyRe(r"([a-z])\1{2,}")


def fold(word: str) -> str:
    """Fold plurals and possessives: 'losses' -> 'loss', 'gpus' -> 'gpu'."""
    if len(word) <= 3 or word.isdigit():
        return word
    if word.endswith("ies") and len(word) > 4:
        return word[:-3] + "y"
    if word.endswith(("sses", "xes", "ches", "shes")):
        return word[:-2]
    if word.endswith("s") and not word.endswith(("ss", "is")) and not (word.endswith("us") and len(word) > 4):
        return word[:-1]  # 'gpus' -> 'gpu', but 'status', 'analysis', 'loss' stay
    return word


_JOINERS = str.maketrans("", "", "'’-_")  # "doesn't" -> "doesnt", "multi-gpu" -> "multigpu"


def tokens(text: str) -> list[str]:
    """Lower-case word tokens; apostrophes, hyphens and underscores inside words join them."""
    out = []
    for t in _TOKEN.findall(text.lower().translate(_JOINERS)):
        if len(t) > 2 and t[-2:] in ("st", "nd", "rd", "th") and t[:-2].isdigit():
            t = t[:-2]  # '3rd' -> '3'
        out.append(fold(t))
    return out


_SIZE_UNITS = frozenset(("gib", "mib", "gb", "mb", "g", "tb", "tib"))


def _is_memory_size(tok: str) -> bool:
    """'12gb', '80gib', '512mb', '24g'."""
    for unit in ("gib", "mib", "gb", "mb", "g"):
        if tok.endswith(unit) and tok[: -len(unit)].isdigit():
            return True
    return False


class Vocabulary:
    """The tokenised phrases.toml: terms by first token, patterns, negation and typo data."""

    def __init__(self, data: dict[str, Any]):
        # first token -> ((term tokens, concept), ...), longest terms first
        self.by_first: dict[str, tuple[tuple[tuple[str, ...], str], ...]] = data["by_first"]
        self.words: frozenset[str] = data["words"]
        self.patterns: list[dict[str, Any]] = data["patterns"]
        self.contexts: list[dict[str, Any]] = data["contexts"]
        self.questions: list[dict[str, Any]] = data["questions"]
        self.negators: frozenset[str] = data["negators"]
        self.clause_breaks: frozenset[str] = data["clause_breaks"]
        self.negatable: frozenset[str] = data["negatable"]
        self.keep: frozenset[str] = data["keep"]
        self.by_letter: dict[str, tuple[str, ...]] = data["by_letter"]  # typo candidates by first letter


@cache
def vocabulary() -> Vocabulary:
    return Vocabulary(_vocabulary_data())


def _vocabulary_data() -> dict[str, Any]:
    """Tokenising every phrase and building the typo index costs more than the rest of `ask`:
    the result is precompiled once (rules/cache.py), keyed by phrases.toml and this module."""
    from torchdoctor.rules.cache import cached

    return cached(
        "vocabulary",
        [catalog.DATA / "phrases.toml", Path(__file__)],
        lambda: _build_vocabulary(catalog.load_toml("phrases.toml")),
    )


def _build_vocabulary(data: dict[str, Any]) -> dict[str, Any]:
    by_first: dict[str, list[tuple[tuple[str, ...], str]]] = {}
    words: set[str] = set()
    for concept, phrases in data["concept"].items():
        for phrase in phrases:
            term = tuple(tokens(phrase))
            if term:
                by_first.setdefault(term[0], []).append((term, concept))
                words.update(term)
    negation = data.get("negation", {})
    by_letter: dict[str, list[str]] = {}
    for w in sorted(words):
        if len(w) >= 4 and w.isalpha():
            by_letter.setdefault(w[0], []).append(w)
    return {
        "by_first": {k: tuple(sorted(v, key=lambda tc: -len(tc[0]))) for k, v in by_first.items()},
        "words": frozenset(words),
        "patterns": list(data.get("pattern", ())),
        "contexts": list(data.get("context", ())),
        "questions": list(data.get("question_trigger", ())),
        "negators": frozenset(tokens(" ".join(negation.get("negators", ())))),
        "clause_breaks": frozenset(tokens(" ".join(negation.get("clause_breaks", ())))),
        "negatable": frozenset(negation.get("concepts", ())),
        "keep": frozenset(fold(w) for w in data.get("typo", {}).get("keep", ())),
        "by_letter": {k: tuple(v) for k, v in by_letter.items()},
    }


def _one_edit(a: str, b: str) -> bool:
    """True when `a` and `b` differ by one substitution, insertion, deletion or adjacent swap."""
    if len(a) == len(b):
        diff = [i for i in range(len(a)) if a[i] != b[i]]
        return len(diff) == 1 or (len(diff) == 2 and diff[1] == diff[0] + 1 and a[diff[0]] == b[diff[1]] and a[diff[1]] == b[diff[0]])
    if len(a) < len(b):
        a, b = b, a
    if len(a) - len(b) != 1:
        return False
    i = 0
    while i < len(b) and a[i] == b[i]:
        i += 1
    return a[i + 1 :] == b[i:]


@lru_cache(maxsize=4096)
def correct(word: str) -> str:
    """The vocabulary word `word` was meant to be: itself, squeezed ('sloooow'), or one edit away."""
    vocab = vocabulary()
    if word in vocab.words or not word.isalpha():
        return word
    if _STRETCH.search(word):
        for squeezed in (_STRETCH.sub(r"\1", word), _STRETCH.sub(r"\1\1", word)):
            if squeezed in vocab.words:
                return squeezed
        word = _STRETCH.sub(r"\1\1", word)
    if len(word) < 5 or word in vocab.keep:
        return word
    candidates = [w for w in vocab.by_letter.get(word[0], ()) if abs(len(w) - len(word)) <= 1 and _one_edit(word, w)]
    return candidates[0] if len(candidates) == 1 else word


def concepts_in(text: str) -> dict[str, str]:
    """Concepts found in `text`, each with the words that matched it (negated mentions left out)."""
    return {c: words for c, (words, _) in _concept_spans(text).items()}


def _concept_spans(text: str) -> dict[str, tuple[str, list[int]]]:
    """concept -> (matched words, token positions of its mentions)."""
    vocab = vocabulary()
    toks = [correct(t) for t in tokens(text)]
    found: dict[str, tuple[str, list[int]]] = {}
    for i, tok in enumerate(toks):
        for term, concept in vocab.by_first.get(tok, ()):
            if tuple(toks[i : i + len(term)]) != term:
                continue
            if concept in vocab.negatable and _negated(toks, i, vocab):
                continue
            words, positions = found.setdefault(concept, (" ".join(term), []))
            positions.append(i)
        if tok.isdigit() or tok.endswith("%") or tok in ("percent", "pct"):
            found.setdefault("number", (tok, []))[1].append(i)
            if not tok.isdigit():  # '20%', '20 percent': a share, as of the GPU's time
                found.setdefault("percent", (tok, []))[1].append(i)
        elif _is_memory_size(tok) or (tok in _SIZE_UNITS and i and toks[i - 1].isdigit()):  # '12gb', '1.1 GB'
            found.setdefault("memory_size", (tok, []))[1].append(i)
    return found


def _negated(toks: list[str], i: int, vocab: Vocabulary) -> bool:
    """'no OOM', 'not slow', "doesn't hang", 'without any NaN' (within the same clause)."""
    for j in range(i - 1, max(-1, i - 4), -1):
        if toks[j] in vocab.clause_breaks:
            return False
        if toks[j] in vocab.negators:
            return True
    return False


# ---------------------------------------------------------------------------
# Error signatures (signatures.toml)


class Signature:
    """One row of signatures.toml; its regular expression is compiled on first use."""

    __slots__ = ("id", "needle", "pattern", "symptoms", "contexts", "priority", "summary", "units", "derive", "example")

    def __init__(self, row: dict[str, Any]):
        self.id: str = row["id"]
        self.needle: str = row["needle"]
        self.pattern: str = row["pattern"]
        self.symptoms: tuple[str, ...] = tuple(row["symptoms"])
        self.contexts: tuple[str, ...] = tuple(row.get("contexts", ()))
        self.priority: int = int(row.get("priority", 50))
        self.summary: str = row["summary"]
        self.units: dict[str, str] = row.get("units", {})
        self.derive: str | None = row.get("derive")
        self.example: str = row.get("example", "")

    @property
    def regex(self) -> re.Pattern[str]:
        return _compile(self.pattern)


@cache
def _compile(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, re.MULTILINE)


@cache
def signatures() -> tuple[Signature, ...]:
    return tuple(Signature(r) for r in catalog.load_toml("signatures.toml")["signature"])


@cache
def _context_hints() -> tuple[tuple[str, tuple[str, ...]], ...]:
    rows = catalog.load_toml("signatures.toml").get("context_hint", ())
    return tuple((r["context"], tuple(r["needles"])) for r in rows)


@cache
def _noise_lines() -> tuple[str, ...]:
    return tuple(catalog.load_toml("signatures.toml").get("log", {}).get("ignore_lines", ()))


_OCCURRENCES = 4  # needle occurrences tried per signature, from the end of the text
_BEFORE = 400  # characters before a needle's line where a message may start (wrapped lines)
_AFTER = 6000  # characters after a needle a pattern may span


def search(sig: Signature, text: str) -> re.Match[str] | None:
    """The signature's match nearest the end of `text`, tried only where its needle occurs."""
    end = len(text)
    for _ in range(_OCCURRENCES):
        pos = text.rfind(sig.needle, 0, end)
        if pos == -1:
            return None
        line_start = text.rfind("\n", 0, pos) + 1
        start = text.rfind("\n", 0, max(0, line_start - _BEFORE)) + 1 if line_start else 0
        stop = min(len(text), pos + len(sig.needle) + _AFTER)
        for match in sig.regex.finditer(text, start, stop):
            if match.start() > pos:
                break
            if match.end() > pos:  # the match holds this occurrence of the needle
                return match
        end = pos
    return None


_SIZE = _LazyRe(r"([\d.]+)\s*(bytes|B|KiB|MiB|GiB|TiB|KB|MB|GB|TB)")
_TO_GIB = {
    "B": 1 / 2**30,
    "bytes": 1 / 2**30,
    "KiB": 1 / 2**20,
    "MiB": 1 / 2**10,
    "GiB": 1.0,
    "TiB": 2**10,
    # the MPS allocator labels binary sizes "KB/MB/GB"
    "KB": 1 / 2**20,
    "MB": 1 / 2**10,
    "GB": 1.0,
    "TB": 2**10,
}
_INT = _LazyRe(r"-?\d+")


def to_gib(size: str) -> float | None:
    m = _SIZE.fullmatch(size.strip())
    return round(float(m.group(1)) * _TO_GIB[m.group(2)], 4) if m else None


def _convert(unit: str | None, name: str, raw: str) -> tuple[str, Any] | None:
    raw = raw.strip()
    if unit == "size":
        gib = to_gib(raw)
        return (f"{name}_gib", gib) if gib is not None else None
    if unit == "bytes":
        return f"{name}_gib", round(int(raw) / 2**30, 4)
    if unit == "int":
        return name, int(raw)
    if unit == "float":
        return name, float(raw)
    if unit == "shape":
        return name, [int(n) for n in _INT.findall(raw)]
    if unit == "ints":
        return name, [int(n) for n in raw.split()]
    if unit == "keys":
        return name, re.findall(r'"([^"]*)"', raw)
    if unit == "names":
        return name, [n.strip() for n in raw.split(",") if n.strip()]
    return name, raw


class Reading:
    """What one signature's match says: its values, and symptoms/contexts the values imply."""

    __slots__ = ("values", "symptoms", "contexts")

    def __init__(self, values: dict[str, Any], symptoms: tuple[str, ...], contexts: tuple[str, ...]):
        self.values = values
        self.symptoms = symptoms
        self.contexts = contexts


def extract_values(sig: Signature, match: re.Match[str]) -> dict[str, Any]:
    """Named groups of a signature's match, converted by the signature's `units` and `derive` step."""
    return read_match(sig, match).values


def read_match(sig: Signature, match: re.Match[str]) -> Reading:
    values: dict[str, Any] = {}
    for name, raw in match.groupdict().items():
        if raw is None or not raw.strip():
            continue
        converted = _convert(sig.units.get(name), name, raw)
        if converted is not None:
            values[converted[0]] = converted[1]
    reading = Reading(values, sig.symptoms, sig.contexts)
    if sig.derive:
        _DERIVE[sig.derive](reading)
    return reading


# -- derive steps: what the numbers and names imply ---------------------------


def _derive_oom(r: Reading) -> None:
    v = r.values
    if "reserved_gib" in v and "allocated_gib" in v:  # before PyTorch 2.1
        v["reserved_unallocated_gib"] = round(v["reserved_gib"] - v["allocated_gib"], 4)
    elif "reserved_unallocated_gib" in v and "allocated_gib" in v:
        v["reserved_gib"] = round(v["allocated_gib"] + v["reserved_unallocated_gib"], 4)
    requested, spare = v.get("requested_gib"), v.get("reserved_unallocated_gib")
    # Enough memory was reserved but not in one piece: the allocator is fragmented.
    if requested is not None and spare is not None and spare >= requested:
        v["fragmented"] = True
        r.symptoms = (*r.symptoms, "fragmentation")
    if requested is not None and "total_gib" in v and requested > v["total_gib"]:
        v["larger_than_device"] = True


def _derive_worker_signal(r: Reading) -> None:
    signal = r.values.get("signal", "")
    if signal.startswith("Bus error"):
        r.symptoms = ("host-oom", "dataloader-worker-error")
    elif signal.startswith(("Segmentation fault", "Aborted")):
        r.symptoms = ("dataloader-worker-error", "host-oom")


def _derive_devices(r: Reading) -> None:
    v = r.values
    a = v.pop("device_a", None) or v.pop("device_a2", None)
    b = v.pop("device_b", None) or v.pop("device_b2", None)
    if a and b:
        v["devices"] = [a, b]


def _tensor_type(name: str) -> tuple[str, str]:
    """'torch.cuda.HalfTensor' -> ('cuda', 'Half')."""
    parts = name.split(".")
    return ("cuda" if "cuda" in parts else "cpu"), parts[-1].removesuffix("Tensor")


def _derive_tensor_types(r: Reading) -> None:
    v = r.values
    input_device, input_dtype = _tensor_type(v.get("input_type", ""))
    weight_device, weight_dtype = _tensor_type(v.get("weight_type", ""))
    v.update(input_device=input_device, weight_device=weight_device)
    if input_device == weight_device and input_dtype != weight_dtype:
        v["dtypes"] = [input_dtype, weight_dtype]
        _dtype_symptoms(r, [input_dtype, weight_dtype])


_HALF = _LazyRe(r"(?:c10::)?(?:Half|BFloat16|float16|bfloat16)$", re.IGNORECASE)


def _dtype_symptoms(r: Reading, dtypes: list[str]) -> None:
    if any(_HALF.match(d) for d in dtypes):
        r.symptoms = ("amp-dtype-mismatch", "dtype-mismatch")
        r.contexts = (*r.contexts, "amp")
    else:
        r.symptoms = ("dtype-mismatch",)


def _derive_dtypes(r: Reading) -> None:
    v = r.values
    names = [
        v.get(k)
        for k in ("expected_dtype", "found_dtype", "dtype_a", "dtype_b", "input_dtype", "param_dtype")
        if v.get(k)
    ]
    v["dtypes"] = names
    _dtype_symptoms(r, names)


def _derive_matmul(r: Reading) -> None:
    v = r.values
    mat1, mat2 = v.get("mat1_shape"), v.get("mat2_shape")
    if mat1 and mat2 and len(mat1) == 2 and len(mat2) == 2:
        # F.linear computes input @ weight.T: mat2 is (in_features, out_features)
        v.update(input_features=mat1[1], expected_features=mat2[0], out_features=mat2[1], rows=mat1[0])


# Wrappers whose state_dict keys carry a prefix, and who adds it.
_KEY_PREFIXES = {
    "module.": "DistributedDataParallel / DataParallel",
    "_orig_mod.": "torch.compile",
    "module._orig_mod.": "torch.compile inside DistributedDataParallel",
    "_orig_mod.module.": "DistributedDataParallel inside torch.compile",
}
_KEY_LIMIT = 300  # keys compared per side


def _derive_state_dict(r: Reading) -> None:
    v = r.values
    missing = v.get("missing_keys", [])[:_KEY_LIMIT]
    unexpected = v.get("unexpected_keys", [])[:_KEY_LIMIT]
    v["missing_count"] = len(v.get("missing_keys", []))
    v["unexpected_count"] = len(v.get("unexpected_keys", []))
    if "checkpoint_shape" in v:
        v["size_mismatch"] = True
    for side, longer, shorter in (("checkpoint", unexpected, missing), ("model", missing, unexpected)):
        prefix = _common_prefix(longer, shorter)
        if prefix:
            v["prefix"] = prefix
            v["prefix_side"] = side  # the side whose keys carry the prefix
            if prefix in _KEY_PREFIXES:
                v["prefix_source"] = _KEY_PREFIXES[prefix]
            return
    # Only one side known (e.g. only unexpected keys): a wrapper prefix on all of them still tells.
    for side, keys in (("checkpoint", unexpected), ("model", missing)):
        for prefix in sorted(_KEY_PREFIXES, key=len, reverse=True):
            if keys and all(k.startswith(prefix) for k in keys):
                v.update(prefix=prefix, prefix_side=side, prefix_source=_KEY_PREFIXES[prefix])
                return


def _common_prefix(longer: list[str], shorter: list[str]) -> str | None:
    """The prefix P with `P + key` in `longer` for most keys of `shorter`."""
    if not longer or not shorter:
        return None
    targets = set(shorter)
    counts: Counter[str] = Counter()
    for key in longer:
        parts = key.split(".")
        for cut in range(1, min(len(parts), 4)):
            if ".".join(parts[cut:]) in targets:
                counts[".".join(parts[:cut]) + "."] += 1
                break
    if not counts:
        return None
    prefix, n = counts.most_common(1)[0]
    return prefix if n * 2 >= len(shorter) else None


_SIZE_GUARD = _LazyRe(r"tensor '(?P<tensor>.+?)' size mismatch at index (?P<dim>\d+)\. expected (?P<expected>\d+), actual (?P<actual>\d+)")
_DTYPE_GUARD = _LazyRe(r"tensor '(?P<tensor>.+?)' dtype mismatch\. expected (?P<expected>\w+), actual (?P<actual>\w+)")
_FRAME_ID = _LazyRe(r"^\d+/\d+: ")


def _derive_guard(r: Reading) -> None:
    v = r.values
    reason = v.get("last_reason")
    if not reason:
        return
    reason = _FRAME_ID.sub("", reason.strip())
    v["last_reason"] = reason
    m = _SIZE_GUARD.search(reason)
    if m:
        v.update(
            reason_kind="size",
            guard_tensor=m["tensor"],
            guard_dim=int(m["dim"]),
            expected_size=int(m["expected"]),
            actual_size=int(m["actual"]),
        )
        return
    m = _DTYPE_GUARD.search(reason)
    if m:
        v.update(reason_kind="dtype", guard_tensor=m["tensor"], expected_dtype=m["expected"], actual_dtype=m["actual"])
    elif ".training" in reason:
        v["reason_kind"] = "training-flag"
    elif "___check_obj_id" in reason or "id(" in reason:
        v["reason_kind"] = "object-identity"
    else:
        v["reason_kind"] = "other"


def _derive_graph_break(r: Reading) -> None:
    v = r.values
    location = v.pop("location", "")
    file, _, line = location.rpartition(":")
    if file and line.isdigit():
        v.update(file=file, line=int(line))
    reason, detail = v.get("reason", ""), v.pop("detail", None)
    if detail and reason.startswith("Encountered graph break when attempting to trace"):
        v["reason"] = detail
    if "item()" in v.get("reason", ""):
        r.symptoms = (*r.symptoms, "host-sync")


def _derive_watchdog(r: Reading) -> None:
    v = r.values
    if "timeout_ms" in v:
        v["timeout_s"] = round(v["timeout_ms"] / 1000, 1)


_NCCL_KINDS = (
    ("remote process exited", "remote"),
    ("unhandled system error", "system"),
    ("unhandled cuda error", "cuda"),
    ("invalid usage", "usage"),
    ("internal error", "internal"),
    ("invalid argument", "usage"),
)


def _derive_nccl(r: Reading) -> None:
    v = r.values
    error = v.get("nccl_error", "").strip()
    v["nccl_error"] = error
    for text, kind in _NCCL_KINDS:
        if text in error:
            v["nccl_error_kind"] = kind
            if kind == "remote":
                r.symptoms = ("rank-crashed", *r.symptoms)
            break


_SIGNALS = {9: "SIGKILL", 11: "SIGSEGV", 6: "SIGABRT", 15: "SIGTERM", 7: "SIGBUS", 8: "SIGFPE", 2: "SIGINT"}


def _derive_exit_signal(r: Reading) -> None:
    v = r.values
    code = v.get("exitcode")
    if isinstance(code, int) and code < 0:
        v.setdefault("signal", _SIGNALS.get(-code, f"signal {-code}"))
    if v.get("signal") == "SIGKILL":  # most often the kernel's OOM killer
        r.symptoms = (*r.symptoms, "host-oom")


_DERIVE: dict[str, Callable[[Reading], None]] = {
    "oom": _derive_oom,
    "worker_signal": _derive_worker_signal,
    "devices": _derive_devices,
    "tensor_types": _derive_tensor_types,
    "dtypes": _derive_dtypes,
    "matmul": _derive_matmul,
    "state_dict": _derive_state_dict,
    "guard": _derive_guard,
    "graph_break": _derive_graph_break,
    "watchdog": _derive_watchdog,
    "nccl": _derive_nccl,
    "exit_signal": _derive_exit_signal,
}


# -- reading a whole pasted text ----------------------------------------------

_EXCEPTION_LINE = _LazyRe(
    r"^[ \t]*(?:[\w.]+\.)?\w*(?:Error|Exception|Interrupt|Warning|Failed)\b(?:[^\n:]{0,80})?:", re.MULTILINE
)
_TRACEBACK = _LazyRe(r"^\s*(?:Traceback \(most recent call last\)|File \".+\", line \d+)", re.MULTILINE)


class Hit:
    """A signature found in a log: its match, the line it sits on, the rank that printed it."""

    __slots__ = ("sig", "match", "line", "rank", "key")

    def __init__(self, sig: Signature, match: re.Match[str], line: str, rank: int | None, key: tuple[int, int, int]):
        self.sig, self.match, self.line, self.rank, self.key = sig, match, line, rank, key


def find_hits(log: Log) -> list[Hit]:
    """Every signature found in the cleaned log, most telling first."""
    text = log.text
    exception_starts = [m.start() for m in _EXCEPTION_LINE.finditer(text)] if "Error" in text or "Warning" in text else []
    last_exception = exception_starts[-1] if exception_starts else -1
    hits: list[Hit] = []
    for sig in signatures():
        if sig.needle not in text:
            continue
        match = search(sig, text)
        if match is None:
            continue
        line_no = log.line_of(match.start())
        line_start = log.line_starts[line_no]
        line_end = text.find("\n", match.start())
        line = text[line_start : line_end if line_end != -1 else len(text)].strip()
        if match.end() > (line_end if line_end != -1 else len(text)):
            line = " ".join(text[line_start : match.end()].split())  # a message wrapped over several lines
        on_last_exception = int(line_start >= last_exception >= 0)
        hits.append(Hit(sig, match, line, log.ranks.get(line_no), (sig.priority, on_last_exception, match.start())))
    hits.sort(key=lambda h: h.key, reverse=True)
    return hits


def read_errors(text: str) -> tuple[list[Symptom], list[str], str | None]:
    """Symptoms from known error messages; the most telling line first."""
    log = clean_log(text)
    hits = find_hits(log)
    symptoms, contexts = _symptoms_of(hits)
    if log.ranks and "distributed" not in contexts:
        contexts.append("distributed")
    return symptoms, contexts, (clip(hits[0].line, 400) if hits else None)


def _symptoms_of(hits: list[Hit]) -> tuple[list[Symptom], list[str]]:
    symptoms: dict[str, Symptom] = {}
    contexts: list[str] = []
    for rank, hit in enumerate(hits):
        confidence = 1.0 if rank == 0 else 0.7
        reading = read_match(hit.sig, hit.match)
        if hit.rank is not None:
            reading.values.setdefault("rank", hit.rank)
        for position, sid in enumerate(reading.symptoms):
            evidence = Evidence(
                kind="error",
                summary=hit.sig.summary,
                quote=clip(hit.line, 400),
                values=dict(reading.values),
                source=hit.sig.id,
            )
            known = symptoms.get(sid)
            if known is None:
                symptoms[sid] = catalog.make_symptom(sid, confidence=round(confidence - 0.05 * position, 2), evidence=[evidence])
            elif any(key not in ev.values for ev in known.evidence for key in reading.values):
                # Another message about the same symptom that adds numbers (e.g. torchrun's exit
                # code after the error itself): keep it as further evidence, after the first.
                known.evidence.append(evidence)
        contexts.extend(c for c in reading.contexts if c not in contexts)
    return list(symptoms.values()), contexts


def log_contexts(log: Log) -> list[str]:
    """Setup facts a log shows in passing: DDP frames, dynamo frames, autocast."""
    found = []
    for context, needles in _context_hints():
        if any(n in log.text for n in needles):
            found.append(context)
    if log.ranks:
        found.append("distributed")
    return found


def is_log(log: Log) -> bool:
    return bool(log.prefixed) or _TRACEBACK.search(log.text) is not None


def prose_of(log: Log, exclude: set[int] = frozenset()) -> str:  # type: ignore[assignment]
    """The user's own words in a pasted log: unindented lines that are not log, traceback or error lines."""
    keep: list[str] = []
    for n, line in enumerate(log.text.split("\n")):
        if n in log.prefixed or n in exclude or not line.strip() or line[:1] in " \t":
            continue
        if _EXCEPTION_LINE.match(line) or _TRACEBACK.match(line) or line.startswith(("During handling", "The above exception")):
            continue
        if any(noise in line for noise in _noise_lines()):
            continue
        keep.append(line)
    return "\n".join(keep)[:PROSE_LIMIT]


# `  File "train.py", line 88, in <module>` and the source line printed under it.
_FRAME = _LazyRe(r'^[ \t]*File "(?P<path>[^"\n]+)", line (?P<line>\d+)(?:, in (?P<function>[^\n]*?))?[ \t]*$', re.MULTILINE)
# Frames that are not the user's: installed packages, the standard library, torch itself (a source
# checkout too), and interpreter pseudo-files (<frozen runpy>, <string>).
_LIBRARY_PATH = _LazyRe(
    r"site-packages|dist-packages|[/\\]lib[/\\]python\d|^<(?!ipython-input)"
    r"|[/\\]torch[/\\](?:nn|autograd|utils|cuda|distributed|optim|amp|_dynamo|_inductor|multiprocessing|jit|fx"
    r"|_tensor\.py|serialization\.py|functional\.py|_utils\.py|_ops\.py|overrides\.py)"
)


def user_frame(text: str, before: int | None = None) -> Location | None:
    """The last traceback frame in the user's own code (before offset `before`, if given).

    Frames in installed packages, the standard library and torch are skipped, so a DataLoader
    worker's re-raised traceback ("Original Traceback ...") points at the user's __getitem__ or
    collate_fn, not at torch/utils/data.
    """
    found = None
    for m in _FRAME.finditer(text):
        if before is not None and m.start() > before:
            break
        path = m["path"].strip()
        if _LIBRARY_PATH.search(path):
            continue
        code = None
        nxt = text.find("\n", m.end())
        if nxt != -1:
            end = text.find("\n", nxt + 1)
            candidate = text[nxt + 1 : end if end != -1 else len(text)]
            if candidate.strip() and candidate[:1] in " \t" and not _FRAME.match(candidate):
                code = candidate.strip()
        found = Location(path=path, line=int(m["line"]), function=(m["function"] or None), code=code)
    return found


_EXCEPTION_PREFIX = _LazyRe(r"^\s*(?:[\w.]+\.)?\w*(?:Error|Exception|Warning)\b:?", re.MULTILINE)


def _own_words(log: Log, hits: list[Hit]) -> int:
    """Words of the user's own around the errors: the text less the matched messages (and the rest of
    each message, as its signature's example words it), the traceback frames with their source
    lines, and the exception names."""
    text = log.text
    theirs: set[str] = set()
    for hit in hits:
        text = text[: hit.match.start()] + " " * (hit.match.end() - hit.match.start()) + text[hit.match.end() :]
        theirs.update(tokens(hit.sig.example))
    kept = []
    skip_next = False
    for line in text.split("\n"):
        if skip_next:
            skip_next = False
            continue
        if _FRAME.match(line):
            skip_next = True
            continue
        kept.append(_EXCEPTION_PREFIX.sub(" ", line))
    return sum(1 for t in tokens("\n".join(kept)) if t.isalpha() and len(t) > 1 and t not in theirs)


def last_exception_message(log: Log) -> str:
    matches = list(_EXCEPTION_LINE.finditer(log.text))
    if not matches:
        return ""
    m = matches[-1]
    end = log.text.find("\n", m.end())
    return log.text[m.end() : end if end != -1 else len(log.text)]


# ---------------------------------------------------------------------------
# Free text


def _holds(rule: dict[str, Any], found: dict[str, Any]) -> bool:
    if any(c not in found for c in rule.get("all", ())):
        return False
    if rule.get("any") and not any(c in found for c in rule["any"]):
        return False
    return not any(c in found for c in rule.get("none", ()))


def _near(rule: dict[str, Any], spans: dict[str, tuple[str, list[int]]]) -> bool:
    """All of the rule's `all` concepts mentioned within `near` tokens of each other."""
    distance = rule.get("near")
    names = rule.get("all", ())
    if not distance or len(names) < 2:
        return True
    first, *rest = names
    return any(all(any(abs(p - q) <= distance for q in spans[c][1]) for c in rest) for p in spans[first][1])


def _distinct(rule: dict[str, Any], spans: dict[str, tuple[str, list[int]]]) -> bool:
    """The rule's `all` concepts are not all one and the same word ('restarted' is both a resume and a
    jump, but one word is not the two facts the rule combines)."""
    names = rule.get("all", ())
    if len(names) < 2:
        return True
    return len({p for c in names for p in spans[c][1]}) > 1


def read_description(text: str) -> tuple[list[Symptom], list[str], dict[str, str]]:
    vocab = vocabulary()
    spans = _concept_spans(text)
    found = {c: words for c, (words, _) in spans.items()}
    scores: dict[str, tuple[float, str]] = {}
    for rule in vocab.patterns:
        if not _holds(rule, found) or not _near(rule, spans) or not _distinct(rule, spans):
            continue
        weight = float(rule.get("weight", 1.0))
        words = [found[c] for c in (*rule.get("all", ()), *rule.get("any", ())) if c in found]
        best = scores.get(rule["symptom"])
        if best is None or weight > best[0]:
            scores[rule["symptom"]] = (weight, ", ".join(dict.fromkeys(words)))
    contexts = [c["id"] for c in vocab.contexts if _holds(c, found)]
    symptoms = [
        catalog.make_symptom(
            sid,
            confidence=round(min(score, 1.0), 2),
            evidence=[Evidence(kind="text", summary=f"the words: {words}", quote=text.strip()[:200])],
        )
        for sid, (score, words) in sorted(scores.items(), key=lambda kv: -kv[1][0])
        if score >= ACCEPT
    ]
    return symptoms, contexts, found


def pick_question(found: dict[str, str], contexts: list[str]) -> Question:
    for trigger in vocabulary().questions:
        if "context" in trigger:
            if trigger["context"] in contexts:
                return make_question(trigger["question"])
        elif _holds(trigger, found):
            return make_question(trigger["question"])
    return make_question("what-is-wrong")


def make_question(question_id: str) -> Question:
    row = catalog.question(question_id)
    return Question(
        id=row["id"],
        text=row["text"],
        choices=[Choice(c["label"], list(c.get("symptoms", ())), list(c.get("contexts", ()))) for c in row["choices"]],
        specialist=row.get("specialist"),
    )


def answer(question: Question, choice_number: int, quote: str) -> Triage:
    """Continue triage with the user's answer (1-based choice number)."""
    choice = question.choices[choice_number - 1]
    symptoms = [
        catalog.make_symptom(
            sid,
            confidence=0.9,
            evidence=[Evidence(kind="text", summary=f"answered: {choice.label}", quote=quote[:200])],
        )
        for sid in choice.symptoms
    ]
    contexts = list(choice.contexts)
    if question.specialist == "distributed" and "distributed" not in contexts:
        contexts.append("distributed")
    return Triage(kind="description", symptoms=symptoms, contexts=contexts)


def triage(text: str) -> Triage:
    log = clean_log(text)
    hits = find_hits(log)
    logged = is_log(log)
    # In a pasted error or log, only the user's own words (and, when no signature is known, the
    # final error message) are read as prose: the wording of a known message, file paths and
    # code in a traceback would otherwise look like symptoms of their own.
    if hits:
        covered = {n for h in hits for n in range(log.line_of(h.match.start()), log.line_of(h.match.end()) + 1)}
        prose = prose_of(log, covered)
    elif logged:
        prose = f"{prose_of(log)}\n{last_exception_message(log)}"
    else:
        prose = log.text
    described, contexts, found = read_description(prose)
    if logged:
        contexts.extend(c for c in log_contexts(log) if c not in contexts)
    frame = None
    if logged:
        frame = user_frame(log.text, hits[0].match.start()) if hits else None
        frame = frame or user_frame(log.text)
    own = _own_words(log, hits) if hits or logged else len(tokens(prose))
    if frame is not None or own >= _OWN_WORDS:
        contexts.append("user-code")  # a frame of theirs, or their own words: not a bare message
    if hits:
        error_symptoms, error_contexts = _symptoms_of(hits)
        contexts.extend(c for c in error_contexts if c not in contexts)
        if frame is not None:
            for s in error_symptoms:
                s.location = s.location or frame
        known = {s.id for s in error_symptoms}
        extra = [s for s in described if s.id not in known]
        for s in extra:
            s.confidence = round(s.confidence * 0.6, 2)
        return Triage("error", error_symptoms + extra, contexts, None, clip(hits[0].line, 400))
    if described:
        return Triage("description", described, contexts)
    return Triage("ambiguous", [], contexts, pick_question(found, contexts))
