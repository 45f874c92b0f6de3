"""CLI command `fit`: will this training step fit on that GPU? (see doctor/fit/). Only typer here."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

HELP = """Estimate the peak GPU memory of one training step of your script, on this machine,
without a GPU, and say for each card whether it fits and the largest batch that does.

The script runs under fake tensors (no real memory, no GPU needed) until its second
optimizer step ends; CUDA requests in it (`.cuda()`, `device="cuda"`, CUDA autocast) are
honoured as on one GPU. Its own arguments go after `--`:

  torchdoctor fit train.py -- --batch-size 32
  torchdoctor fit train.py --gpu 24GB --gpu A100-80GB
  torchdoctor fit train.py --format json

Exit codes: 0 estimated; 2 usage error (no script, unknown GPU); 4 the step could not
be estimated (the script failed or exited before two optimizer steps, or an operation
cannot run under fake tensors: the line is named).
"""


def register(app: typer.Typer) -> None:
    """Add `fit` to the app."""

    @app.command("fit", help=HELP, context_settings={"allow_interspersed_args": True})
    def fit(
        target: Annotated[
            list[str] | None,
            typer.Argument(help="SCRIPT, then the script's own arguments after `--`.", metavar="SCRIPT [-- ARGS]",
                           show_default=False),
        ] = None,
        gpu: Annotated[
            list[str] | None,
            typer.Option("--gpu", help="A card (3090, A100-80GB, H100, T4, ...) or a size (24GB); repeatable. "
                                      "Default: 10, 12, 15, 24, 40, 48 and 80 GB cards."),
        ] = None,
        batch_arg: Annotated[
            str | None,
            typer.Option("--batch-arg", help="The script's argparse option that holds the batch size, if it is "
                                            "not one of batch_size, batch, bs, train_batch_size, ..."),
        ] = None,
        what_if: Annotated[
            bool, typer.Option("--what-if/--no-what-if", help="Measure the usual levers (bf16, checkpointing, ...).")
        ] = True,
        timeout: Annotated[float, typer.Option("--timeout", help="Seconds allowed for each measured step.")] = 600.0,
        fmt: Annotated[str, typer.Option("--format", "-f", help="text | json")] = "text",
    ) -> None:
        import os

        from torchdoctor import exitcodes
        from torchdoctor.cli import check_format, fail

        fmt = check_format(fmt, ("text", "json"))
        if not target:
            raise fail("fit needs a script: torchdoctor fit train.py [-- ARGS]")
        script, argv = target[0], list(target[1:])
        if not os.path.isfile(script):
            raise fail(f"no such script: {script}")
        from torchdoctor.fit import gpus
        from torchdoctor.fit.estimate import FitError, estimate
        from torchdoctor.fit.render import as_json, as_text

        try:
            cards = gpus.resolve(list(gpu or []))
        except gpus.UnknownGpu as exc:
            raise fail(str(exc)) from None
        spec = {"script": script, "argv": argv, "batch_arg": batch_arg, "steps": 2, "cwd": os.getcwd(),
                "card": {k: cards[0][k] for k in ("name", "bytes", "major", "minor")}}
        try:
            result = estimate(spec, cards, timeout=timeout, levers=what_if)
        except FitError as exc:
            sys.stderr.write(f"torchdoctor fit: {exc}\n")
            raise typer.Exit(exitcodes.SCRIPT_FAILED) from None
        sys.stdout.write(as_json(result) if fmt == "json" else as_text(result))
