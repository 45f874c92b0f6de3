"""CLI commands of the static door: check, rules, explain (see doctor/check.py).

Only typer is imported at module level; each command imports what it needs.
"""

from __future__ import annotations

from typing import Annotated

import typer

from torchdoctor.cli import DetailsOpt  # the option every door shares


def register(app: typer.Typer) -> None:
    """Add `check`, `rules` and `explain` to the app."""

    @app.command()
    def check(
        paths: Annotated[
            list[str] | None,
            typer.Argument(help="Files and folders to check (.py and .ipynb); `-` reads standard input. Default: `.`"),
        ] = None,
        fmt: Annotated[
            str, typer.Option("--format", "-f", help="text | json | sarif | github | markdown | html")
        ] = "text",
        select: Annotated[
            list[str] | None,
            typer.Option("--select", help="Rule codes or prefixes to run (comma-separated or repeated); replaces the config's."),
        ] = None,
        ignore: Annotated[
            list[str] | None,
            typer.Option("--ignore", help="Rule codes or prefixes to skip (comma-separated or repeated); adds to the config's."),
        ] = None,
        fail_on: Annotated[
            str | None,
            typer.Option("--fail-on", help="Exit 1 on findings at or above: error | warning | info | never (default: warning)."),
        ] = None,
        statistics: Annotated[bool, typer.Option("--statistics", help="Print a count per rule instead of the report.")] = False,
        config: Annotated[
            str | None, typer.Option("--config", help="A pyproject.toml (or TOML file) with [tool.torchdoctor] settings.")
        ] = None,
        jobs: Annotated[
            int | None,
            typer.Option("--jobs", "-j", help="Worker processes for large trees (default: automatic; 1 = one process)."),
        ] = None,
        stdin_filename: Annotated[
            str | None, typer.Option("--stdin-filename", help="The file name to report for `-` (standard input).")
        ] = None,
        details: DetailsOpt = False,
    ) -> None:
        """Check training scripts and notebooks with static rules; exit 1 on findings at or above --fail-on."""
        from torchdoctor.check import CheckRequest, run_check, split_codes

        request = CheckRequest(
            paths=list(paths or ["."]),
            fmt=fmt,
            select=split_codes(select) if select else None,
            ignore=split_codes(ignore),
            fail_on=fail_on,
            statistics=statistics,
            config=config,
            jobs=jobs,
            stdin_filename=stdin_filename,
            details=details,
        )
        raise typer.Exit(run_check(request))

    @app.command("rules")
    def rules_command(
        fmt: Annotated[str, typer.Option("--format", "-f", help="text | json | markdown")] = "text",
    ) -> None:
        """List every static rule: code, severity, specialist, name and what it finds."""
        from torchdoctor.rules.static.docs import print_rules

        raise typer.Exit(print_rules(fmt))

    @app.command()
    def explain(
        code: Annotated[str, typer.Argument(help="A rule code (TD101) or name (graph-accumulated-across-steps).")],
        fmt: Annotated[str, typer.Option("--format", "-f", help="text | json | markdown")] = "text",
    ) -> None:
        """Explain a rule: what it finds, why it matters, a bad and a good example."""
        from torchdoctor.rules.static.docs import print_explanation

        raise typer.Exit(print_explanation(code, fmt))
