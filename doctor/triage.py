"""Text triage: a user's sentence or a pasted error -> symptoms, contexts, or one question.

Two readers, both driven by data in `rules/data/`:

- error signatures (`signatures.toml`): regular expressions for messages as
  PyTorch, CUDA, NCCL, dynamo and the DataLoader print them. A whole
  traceback is read for its most telling line (highest priority, then the
  last exception line), not its first.
- free text (`phrases.toml`): concepts (synonym sets) matched on normalised
  tokens — lower case, plurals folded, abbreviations expanded, one-letter
  typos forgiven — and patterns that combine concepts into symptoms and
  contexts.

When neither finds a symptom with enough confidence, triage returns ONE
clarifying question instead of a guess.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from torchdoctor.model import Choice, Evidence, Question, Symptom
from torchdoctor.rules import catalog

ACCEPT = 0.5  # a symptom below this score is not routed on


@dataclass
class Triage:
    kind: str  # error | description | ambiguous
    symptoms: list[Symptom] = field(default_factory=list)
    contexts: list[str] = field(default_factory=list)
    question: Question | None = None
    telling_line: str | None = None


# ---------------------------------------------------------------------------
# Normalisation


_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_TOKEN = re.compile(r"[a-z0-9]+(?:%|)")


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


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


def tokens(text: str) -> list[str]:
    """Lower-case word tokens; hyphens and underscores inside words join them."""
    text = text.lower()
    text = re.sub(r"(?<=[a-z0-9])[-_](?=[a-z0-9])", "", text)
    return [fold(t) for t in _TOKEN.findall(text)]


# ---------------------------------------------------------------------------
# Vocabulary (phrases.toml)


@dataclass(frozen=True)
class Vocabulary:
    # concept -> list of token tuples
    terms: dict[str, tuple[tuple[str, ...], ...]]
    # first token -> [(term tokens, concept)]
    by_first: dict[str, tuple[tuple[tuple[str, ...], str], ...]]
    words: frozenset[str]
    patterns: tuple[dict[str, Any], ...]
    contexts: tuple[dict[str, Any], ...]
    questions: tuple[dict[str, Any], ...]


@cache
def vocabulary() -> Vocabulary:
    data = catalog.load_toml("phrases.toml")
    terms: dict[str, tuple[tuple[str, ...], ...]] = {}
    by_first: dict[str, list[tuple[tuple[str, ...], str]]] = {}
    words: set[str] = set()
    for concept, phrases in data["concept"].items():
        toks = tuple(t for t in (tuple(tokens(p)) for p in phrases) if t)
        terms[concept] = toks
        for t in toks:
            by_first.setdefault(t[0], []).append((t, concept))
            words.update(t)
    return Vocabulary(
        terms=terms,
        by_first={k: tuple(v) for k, v in by_first.items()},
        words=frozenset(words),
        patterns=tuple(data.get("pattern", ())),
        contexts=tuple(data.get("context", ())),
        questions=tuple(data.get("question_trigger", ())),
    )


def _deletes(word: str) -> set[str]:
    return {word[:i] + word[i + 1 :] for i in range(len(word))}


@cache
def _typo_index() -> dict[str, tuple[str, ...]]:
    """Deletion neighbourhood of every vocabulary word (SymSpell, distance 1)."""
    index: dict[str, list[str]] = {}
    for w in vocabulary().words:
        if len(w) < 5 or w.isdigit():
            continue
        for d in _deletes(w) | {w}:
            index.setdefault(d, []).append(w)
    return {k: tuple(v) for k, v in index.items()}


def correct(word: str) -> str:
    """The vocabulary word one edit away from `word`, if exactly one is."""
    vocab = vocabulary().words
    if word in vocab or len(word) < 5 or not word.isalpha():
        return word
    index = _typo_index()
    candidates: set[str] = set(index.get(word, ()))
    for d in _deletes(word):
        candidates.update(index.get(d, ()))
    candidates = {c for c in candidates if abs(len(c) - len(word)) <= 1 and c[0] == word[0]}
    return candidates.pop() if len(candidates) == 1 else word


def concepts_in(text: str) -> dict[str, str]:
    """Concepts found in `text`, each with the words that matched it."""
    vocab = vocabulary()
    toks = [correct(t) for t in tokens(text)]
    found: dict[str, str] = {}
    for i, tok in enumerate(toks):
        for term, concept in vocab.by_first.get(tok, ()):
            if tuple(toks[i : i + len(term)]) == term:
                found.setdefault(concept, " ".join(term))
        if tok.isdigit() or tok.endswith("%"):
            found.setdefault("number", tok)
    return found


# ---------------------------------------------------------------------------
# Error signatures (signatures.toml)


@dataclass(frozen=True)
class Signature:
    id: str
    regex: re.Pattern[str]
    symptoms: tuple[str, ...]
    contexts: tuple[str, ...]
    priority: int
    summary: str
    units: dict[str, str]


@cache
def signatures() -> tuple[Signature, ...]:
    rows = catalog.load_toml("signatures.toml")["signature"]
    return tuple(
        Signature(
            id=r["id"],
            regex=re.compile(r["pattern"], re.MULTILINE),
            symptoms=tuple(r["symptoms"]),
            contexts=tuple(r.get("contexts", ())),
            priority=int(r.get("priority", 50)),
            summary=r["summary"],
            units=dict(r.get("units", {})),
        )
        for r in rows
    )


_SIZE = re.compile(r"([\d.]+)\s*(B|KiB|MiB|GiB|TiB|bytes)")
_TO_GIB = {"B": 1 / 2**30, "bytes": 1 / 2**30, "KiB": 1 / 2**20, "MiB": 1 / 2**10, "GiB": 1.0, "TiB": 2**10}


def to_gib(size: str) -> float | None:
    m = _SIZE.fullmatch(size.strip())
    return round(float(m.group(1)) * _TO_GIB[m.group(2)], 4) if m else None


def extract_values(sig: Signature, match: re.Match[str]) -> dict[str, Any]:
    """Named groups of a signature's match, converted by the signature's `units`."""
    values: dict[str, Any] = {}
    for name, raw in match.groupdict().items():
        if raw is None:
            continue
        unit = sig.units.get(name)
        if unit == "size":
            gib = to_gib(raw)
            if gib is not None:
                values[f"{name}_gib"] = gib
        elif unit == "int":
            values[name] = int(raw)
        else:
            values[name] = raw.strip()
    if "reserved_gib" in values and "allocated_gib" in values and "reserved_unallocated_gib" not in values:
        values["reserved_unallocated_gib"] = round(values["reserved_gib"] - values["allocated_gib"], 4)
    return values


_EXCEPTION_LINE = re.compile(r"^\s*(?:[\w.]+\.)?\w*(?:Error|Exception|Interrupt|Warning)\b.*:", re.MULTILINE)


def read_errors(text: str) -> tuple[list[Symptom], list[str], str | None]:
    """Symptoms from known error messages; the most telling line first."""
    hits: list[tuple[tuple[int, int, int], Signature, re.Match[str], str]] = []
    exception_starts = [m.start() for m in _EXCEPTION_LINE.finditer(text)]
    last_exception = exception_starts[-1] if exception_starts else -1
    for sig in signatures():
        match = sig.regex.search(text)
        if match is None:
            continue
        line_start = text.rfind("\n", 0, match.start()) + 1
        line_end = text.find("\n", match.end())
        line = text[line_start : line_end if line_end != -1 else len(text)].strip()
        on_last_exception = int(line_start >= last_exception >= 0)
        hits.append(((sig.priority, on_last_exception, match.start()), sig, match, line))
    if not hits:
        return [], [], None
    hits.sort(key=lambda h: h[0], reverse=True)
    symptoms: list[Symptom] = []
    contexts: list[str] = []
    seen: set[str] = set()
    for rank, (_, sig, match, line) in enumerate(hits):
        confidence = 1.0 if rank == 0 else 0.7
        values = extract_values(sig, match)
        for position, sid in enumerate(sig.symptoms):
            if sid in seen:
                continue
            seen.add(sid)
            symptoms.append(
                catalog.make_symptom(
                    sid,
                    confidence=round(confidence - 0.05 * position, 2),
                    evidence=[Evidence(kind="error", summary=sig.summary, quote=_clip(line), values=values, source=sig.id)],
                )
            )
        contexts.extend(c for c in sig.contexts if c not in contexts)
    return symptoms, contexts, _clip(hits[0][3])


def _clip(line: str, limit: int = 400) -> str:
    return line if len(line) <= limit else line[: limit - 1] + "…"


# ---------------------------------------------------------------------------
# Free text


def _holds(rule: dict[str, Any], found: dict[str, str]) -> bool:
    if any(c not in found for c in rule.get("all", ())):
        return False
    if rule.get("any") and not any(c in found for c in rule["any"]):
        return False
    return not any(c in found for c in rule.get("none", ()))


def read_description(text: str) -> tuple[list[Symptom], list[str], dict[str, str]]:
    vocab = vocabulary()
    found = concepts_in(text)
    scores: dict[str, tuple[float, str]] = {}
    for rule in vocab.patterns:
        if not _holds(rule, found):
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
        if _holds(trigger, found) or (trigger.get("context") in contexts):
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
    text = strip_ansi(text)
    error_symptoms, error_contexts, telling = read_errors(text)
    described, contexts, found = read_description(text)
    for c in error_contexts:
        if c not in contexts:
            contexts.append(c)
    if error_symptoms:
        known = {s.id for s in error_symptoms}
        extra = [s for s in described if s.id not in known]
        for s in extra:
            s.confidence = round(s.confidence * 0.6, 2)
        return Triage("error", error_symptoms + extra, contexts, None, telling)
    if described:
        return Triage("description", described, contexts)
    return Triage("ambiguous", [], contexts, pick_question(found, contexts))
