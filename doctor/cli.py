"""The `torchdoctor` command line.

Start-up matters: `ask`, `routes`, `explain`, `check` and `schema` answer at
once, so this module imports only typer; each command imports what it needs,
and nothing here imports torch.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Annotated

import typer

from torchdoctor import exitcodes

app = typer.Typer(
    name="torchdoctor",
    help="A diagnostic assistant for PyTorch training: names the symptom, routes it to the right "
    "specialist and prints a targeted fix report.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

FormatOpt = Annotated[str, typer.Option("--format", "-f", help="text | json | markdown")]
DetailsOpt = Annotated[
    bool,
    typer.Option("--details", help="Text: after the one-screen summary, print the full report (the evidence, code "
                 "frames, every measured number and the specialists' fix reports). Markdown and JSON always hold it."),
]


def version_line() -> str:
    """`torchdoctor 0.1.0 (torch 2.13.0)`, from installed package metadata: torch is not imported."""
    from importlib import metadata

    from torchdoctor import __version__

    try:
        mine = metadata.version("torchdoctor")
    except metadata.PackageNotFoundError:  # run from a source tree that is not installed
        mine = __version__
    try:
        torch = f"torch {metadata.version('torch')}"
    except metadata.PackageNotFoundError:
        torch = "torch not installed"
    return f"torchdoctor {mine} ({torch})"


def _print_version(value: bool) -> None:
    if value:
        sys.stdout.write(version_line() + "\n")
        raise typer.Exit(exitcodes.OK)


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option("--version", help="Print the version of torchdoctor and of the installed torch, and exit.",
                     callback=_print_version, is_eager=True),
    ] = False,
) -> None:
    pass  # options of the app itself (the app's help is Typer's `help=` above)


def fail(message: str, code: int = exitcodes.USAGE) -> typer.Exit:
    """Print a one-line error to stderr and return the Exit to raise."""
    sys.stderr.write(f"torchdoctor: {message}\n")
    return typer.Exit(code)


def check_format(fmt: str, allowed: tuple[str, ...] = ("text", "json", "markdown")) -> str:
    if fmt not in allowed:
        raise fail(f"unknown format {fmt!r}; choose one of: {', '.join(allowed)}")
    return fmt


@app.command()
def ask(
    text: Annotated[
        list[str] | None,
        typer.Argument(help="What goes wrong, in your words, or a pasted error. `-` reads standard input."),
    ] = None,
    fmt: FormatOpt = "text",
    answer: Annotated[
        int | None, typer.Option("--answer", "-a", help="Answer the clarifying question with choice N.")
    ] = None,
    details: DetailsOpt = False,
) -> None:
    """Name the symptom in a description or an error message and print the fix reports."""
    from torchdoctor.ask import run_ask

    check_format(fmt)
    raise typer.Exit(run_ask(text or [], fmt, answer, details))


@app.command()
def routes(fmt: FormatOpt = "text") -> None:
    """Print the symptom routing table."""
    from torchdoctor.routes_table import print_routes

    check_format(fmt)
    print_routes(fmt)


@app.command()
def schema() -> None:
    """Print the JSON schema of the report (every --format json output)."""
    from torchdoctor.schema import schema_text

    sys.stdout.write(schema_text())


@app.command()
def demo(fmt: FormatOpt = "text", details: DetailsOpt = False) -> None:
    """Diagnose the bundled example training script end to end."""
    from torchdoctor.demo.main import run_demo

    check_format(fmt)
    raise typer.Exit(run_demo(fmt, details))


# Commands that live in their own modules, and the module of each.
_MODULE_OF = {"check": "cli_check", "rules": "cli_check", "explain": "cli_check", "run": "cli_run", "fit": "cli_fit"}


def _register_optional(argv: list[str]) -> None:
    """Add the commands of the other doors to the app, only when they may be invoked.

    typer builds every registered command's options at start-up; `ask` should not
    pay for `check`'s and `run`'s. Help and unknown commands get all of them.
    """
    from importlib import import_module

    command = next((a for a in argv[1:] if not a.startswith("-")), None)
    if command in {"ask", "routes", "schema", "demo"} or argv[1:] == ["--version"]:
        return
    wanted = [_MODULE_OF[command]] if command in _MODULE_OF else sorted(set(_MODULE_OF.values()))
    for name in wanted:
        import_module(f"torchdoctor.{name}").register(app)


# What rich's markup reads as a tag (`[bold]`, `[tool.torchdoctor]`, `[/]`), and the backslashes before it.
_MARKUP_TAG = re.compile(r"(\\*)(\[[a-z#/@][^[]*?\])")


def escape_markup(text: str) -> str:
    """Help text as rich shows it literally: tag-like brackets escaped, other brackets left alone
    (an escape before `[-- ARGS]` would be printed)."""
    return _MARKUP_TAG.sub(lambda m: m.group(1) * 2 + "\\" + m.group(2), text)


def _escape_help(command) -> None:
    """Escape the help of a command, its parameters and its subcommands: typer renders help as rich
    markup, which would eat `[tool.torchdoctor]` and the like. Help texts are plain text here."""
    for attr in ("help", "short_help", "epilog"):
        if getattr(command, attr, None):
            setattr(command, attr, escape_markup(getattr(command, attr)))
    for param in command.params:
        if getattr(param, "help", None):
            param.help = escape_markup(param.help)
    for sub in getattr(command, "commands", {}).values():
        _escape_help(sub)


def main() -> None:
    _register_optional(sys.argv)
    try:
        command = typer.main.get_command(app)  # what app() runs, with the help escaped first
        _escape_help(command)
        command()
    except KeyboardInterrupt:
        sys.stderr.write("torchdoctor: interrupted\n")
        sys.exit(exitcodes.INTERRUPTED)
    except Exception as exc:  # noqa: BLE001 - never show a user a traceback
        if os.environ.get("TORCHDOCTOR_DEBUG"):
            raise
        sys.stderr.write(
            f"torchdoctor: internal error: {type(exc).__name__}: {exc} "
            "(set TORCHDOCTOR_DEBUG=1 for the traceback, and please report it)\n"
        )
        sys.exit(exitcodes.INTERNAL)


if __name__ == "__main__":
    main()
