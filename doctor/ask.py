"""`torchdoctor ask`: text triage -> symptoms -> route -> fix reports.

When the text is too vague to route, triage returns one clarifying question:
on a terminal it is asked and the answer continues the triage; `--answer N`
answers it up front; otherwise the question is printed (a `question` object in
JSON) and the command exits with `exitcodes.QUESTION`.
"""

from __future__ import annotations

import sys

from torchdoctor import exitcodes
from torchdoctor.clip import clip
from torchdoctor.model import Question, Report
from torchdoctor.textinput import InputError, clean, decode, is_terminal, read_stdin

PROMPT_TRIES = 3  # invalid answers tolerated on a terminal before giving up


def read_text(parts: list[str]) -> str:
    """The text to triage: the arguments, or standard input for `-` (or a pipe)."""
    if parts == ["-"] or (not parts and sys.stdin is not None and not is_terminal(sys.stdin)):
        return decode(read_stdin(), "standard input")
    if not parts:
        raise InputError('nothing to triage: describe the problem (`torchdoctor ask "loss is NaN"`) or pipe an error into `torchdoctor ask -`.')
    if "-" in parts:
        raise InputError("`-` (read standard input) cannot be combined with other text.")
    return clean(" ".join(parts), "the text")


def build_report(text: str, answer: int | None = None, interactive: bool = False) -> Report:
    """Triage `text`; answer its clarifying question if one is needed and possible."""
    from torchdoctor.diagnosis import diagnose
    from torchdoctor.triage import answer as answer_question
    from torchdoctor.triage import triage

    result = triage(text)
    notes: list[str] = []
    if result.question is not None:
        choice = answer
        if choice is None and interactive:
            choice = prompt(result.question)
        if choice is not None:
            if not 1 <= choice <= len(result.question.choices):
                raise InputError(f"--answer must be between 1 and {len(result.question.choices)} for this question.")
            answered = answer_question(result.question, choice, text)
            for c in result.contexts:
                if c not in answered.contexts:
                    answered.contexts.append(c)
            if not answered.symptoms:
                notes.append(
                    "Paste the whole error message or log: `python train.py 2>&1 | tail -n 200 | torchdoctor ask -`."
                )
            result = answered
    report = Report(
        command="ask",
        target=clip(text.strip(), 2000),
        symptoms=result.symptoms,
        contexts=result.contexts,
        question=result.question,
        notes=notes,
    )
    if result.question is None:
        diagnose(report)
    return report


def prompt(question: Question) -> int | None:
    """Ask the question on the terminal; None when the user gives no usable answer."""
    sys.stderr.write(f"\n{question.text}\n")
    for n, c in enumerate(question.choices, 1):
        sys.stderr.write(f"  {n}. {c.label}\n")
    for _ in range(PROMPT_TRIES):
        sys.stderr.write(f"Choose 1-{len(question.choices)} (Enter to skip): ")
        sys.stderr.flush()
        try:
            raw = sys.stdin.readline()
        except OSError:  # the terminal went away
            raw = ""
        if not raw:  # end of input
            sys.stderr.write("\n")
            return None
        raw = raw.strip()
        if not raw:
            return None
        if raw.isdigit() and 1 <= int(raw) <= len(question.choices):
            return int(raw)
        sys.stderr.write(f"Please type a number from 1 to {len(question.choices)}.\n")
    return None


def run_ask(parts: list[str], fmt: str, answer: int | None, details: bool = False) -> int:
    from torchdoctor.render import render

    try:
        text = read_text(parts)
        interactive = answer is None and parts not in ([], ["-"]) and is_terminal(sys.stdin) and is_terminal(sys.stdout)
        report = build_report(text, answer, interactive)
    except InputError as exc:
        sys.stderr.write(f"torchdoctor: {exc}\n")
        return exitcodes.USAGE
    render(report, fmt, details=details)
    return exitcodes.QUESTION if report.question is not None else exitcodes.OK
