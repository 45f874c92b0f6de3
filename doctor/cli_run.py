"""CLI command of the run-time door: run (see doctor/runner.py). Only typer at module level."""

from __future__ import annotations

from typing import Annotated

import typer
from typer.core import TyperCommand

from torchdoctor.cli import DetailsOpt  # the option every door shares

HELP = """Run a training script under probes and diagnose it from measurements.

The script runs as under `python SCRIPT ARGS` (same argv, working directory,
sys.path and __main__); its own arguments go after `--`:

  torchdoctor run train.py -- --lr 3e-4 --batch-size 64

  torchdoctor run train.py --steps 50 --fail-on error

  torchdoctor run -m mypkg.train --gpu-memory 10GiB -- --epochs 1

  torchdoctor run notebook.ipynb --steps 50   (its code cells in order, as in Jupyter)

  torchdoctor run --nproc-per-node 2 train.py -- --epochs 3   (through torchrun)

  torchdoctor run -- torchrun --nproc-per-node 2 train.py     (your own torchrun line)

  torchdoctor run -- accelerate launch --cpu train.py         (every process accelerate starts)

Exit codes: 0 nothing at or above --fail-on; 1 a measured symptom at or above
--fail-on; 2 usage error; 4 the script failed (non-zero exit, exception,
crash, killed, --timeout, hang); 130 interrupted. Evidence and report.json go
to --out (default .torchdoctor/runs/<timestamp>/).
"""


def _probe_help() -> str:
    """Every name of the probe table (torchdoctor.probes.PROBES), so the help never lags behind it."""
    from torchdoctor.probes import defaults, names  # the probe table: no torch

    default = "all" if defaults() == names() else ",".join(defaults())
    return (f"A probe to run (repeatable or comma-separated), from the probe table: {', '.join(names())}; "
            f"or all, none. Default: {default}.")


COMPILE_BACKENDS = ("eager", "aot_eager", "inductor")


def corrected_line(args: list[str], known: dict[str, bool]) -> str | None:
    """`run train.py --lr 3e-4` -> `torchdoctor run train.py -- --lr 3e-4`: torchdoctor's own options stay
    before the script, every other token after it goes after `--`. None when an unknown option comes
    before the script (then it is not one of the script's arguments).

    `known` maps each option name of `run` to whether it takes a value.
    """
    import shlex

    ours: list[str] = []
    script: list[str] = []
    theirs: list[str] = []
    i = 0
    while i < len(args):
        token = args[i]
        if token == "--":
            theirs += args[i + 1 :]
            break
        name = token.split("=", 1)[0]
        if token.startswith("-") and len(token) > 1 and name not in known and token[:2] in known and not token.startswith("--"):
            name = token[:2]  # a short option with its value attached: -pmemory
        if token.startswith("-") and len(token) > 1 and name in known:
            chunk = args[i : i + (2 if known[name] and token == name else 1)]
            ours += chunk
            if name in ("-m", "--module"):
                script = script or [""]  # the module is the script; nothing positional to move
            i += len(chunk)
            continue
        if not script:
            if token.startswith("-") and len(token) > 1:
                return None
            script = [token]
        else:
            theirs.append(token)
        i += 1
    line = ["torchdoctor", "run", *ours, *(s for s in script if s), "--", *theirs]
    return shlex.join(line)


class RunCommand(TyperCommand):
    """`run`, whose unknown options after the script get one line that shows where they belong."""

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        given = list(args)  # the parser consumes the list it is given
        try:
            return super().parse_args(ctx, args)
        except Exception as exc:
            option = getattr(exc, "option_name", None)  # click's NoSuchOption
            if not option:
                raise
            known = {name: not (param.is_flag or param.count)
                     for param in self.get_params(ctx) if getattr(param, "param_type_name", "") == "option"
                     for name in (*param.opts, *param.secondary_opts)}
            line = corrected_line(given, known)
            import sys

            if line is None:
                sys.stderr.write(f"torchdoctor: {option} is not an option of torchdoctor run "
                                 "(see `torchdoctor run --help`)\n")
            else:
                sys.stderr.write(f"torchdoctor: {option} is not an option of torchdoctor run; the script's own "
                                 f"arguments go after `--`: {line}\n")
            raise typer.Exit(2) from None


def register(app: typer.Typer) -> None:
    """Add `run` to the app."""

    @app.command("run", cls=RunCommand, help=HELP, context_settings={"allow_interspersed_args": True})
    def run(
        target: Annotated[
            list[str] | None,
            typer.Argument(
                help="SCRIPT, then the script's own arguments after `--`.",
                metavar="SCRIPT [-- ARGS]",
                show_default=False,
            ),
        ] = None,
        module: Annotated[
            str | None, typer.Option("--module", "-m", help="Run a module like `python -m MODULE`.")
        ] = None,
        steps: Annotated[
            int | None, typer.Option("--steps", help="Stop cleanly after N optimizer steps (exit 0).")
        ] = None,
        timeout: Annotated[
            float | None, typer.Option("--timeout", help="Stop the script after SECONDS of wall time (exit 4).")
        ] = None,
        hang_timeout: Annotated[
            float | None,
            typer.Option(
                "--hang-timeout",
                help="A hang is no training activity (optimizer step, forward, backward, output) for SECONDS "
                "(default 60, widened to 3x the run's longest quiet spell so far; 0 turns the watchdog off). Before "
                "the first step it counts from the start and waits at least 60 s.",
            ),
        ] = None,
        probe: Annotated[
            list[str] | None,
            typer.Option("--probe", "-p", help=_probe_help()),
        ] = None,
        gpu_memory: Annotated[
            str | None,
            typer.Option("--gpu-memory", help="A memory budget for the fit verdict: a size (10GiB, 24GB: GB read as GiB, as cards are sold) or a card (3090, A100-80GB)."),
        ] = None,
        out: Annotated[
            str | None, typer.Option("--out", "-o", help="Run directory (default .torchdoctor/runs/<timestamp>/).")
        ] = None,
        fmt: Annotated[
            str, typer.Option("--format", "-f", help="text | json | markdown (json: the script's stdout goes to stderr)")
        ] = "text",
        fail_on: Annotated[
            str, typer.Option("--fail-on", help="error | warning | never: exit 1 when a symptom at or above it is measured.")
        ] = "error",
        compile_backend: Annotated[
            str | None,
            typer.Option("--compile-backend", help="Force every torch.compile onto this backend (eager, aot_eager, "
                         "inductor): `eager` finds graph breaks and recompiles in seconds on a CPU."),
        ] = None,
        nproc_per_node: Annotated[
            str | None,
            typer.Option("--nproc-per-node", "--nproc_per_node", help="Launch through torchrun with N processes on "
                         "this node (a number, or auto/cpu/gpu); every rank runs under the probes.",
                         rich_help_panel="Distributed"),
        ] = None,
        nnodes: Annotated[str | None, typer.Option("--nnodes", help="torchrun: number of nodes (or MIN:MAX).",
                                                    rich_help_panel="Distributed")] = None,
        node_rank: Annotated[str | None, typer.Option("--node-rank", "--node_rank", help="torchrun: this node's rank.",
                                                       rich_help_panel="Distributed")] = None,
        master_addr: Annotated[str | None, typer.Option("--master-addr", "--master_addr", help="torchrun: rank 0's "
                                                         "host (static rendezvous).", rich_help_panel="Distributed")] = None,
        master_port: Annotated[str | None, typer.Option("--master-port", "--master_port", help="torchrun: rank 0's "
                                                         "port (static rendezvous).", rich_help_panel="Distributed")] = None,
        rdzv_backend: Annotated[str | None, typer.Option("--rdzv-backend", "--rdzv_backend", help="torchrun: "
                                                          "rendezvous backend (c10d).", rich_help_panel="Distributed")] = None,
        rdzv_endpoint: Annotated[str | None, typer.Option("--rdzv-endpoint", "--rdzv_endpoint", help="torchrun: "
                                                           "rendezvous HOST:PORT.", rich_help_panel="Distributed")] = None,
        rdzv_id: Annotated[str | None, typer.Option("--rdzv-id", "--rdzv_id", help="torchrun: job id.",
                                                     rich_help_panel="Distributed")] = None,
        rdzv_conf: Annotated[str | None, typer.Option("--rdzv-conf", "--rdzv_conf", help="torchrun: rendezvous "
                                                       "settings (k=v,…).", rich_help_panel="Distributed")] = None,
        standalone: Annotated[bool, typer.Option("--standalone", help="torchrun: one node, a free port (the default "
                                                  "without rendezvous options).", rich_help_panel="Distributed")] = False,
        ddp_debug: Annotated[bool, typer.Option("--ddp-debug", help="Set TORCH_DISTRIBUTED_DEBUG=DETAIL in every rank: "
                                                 "collectives are checked across ranks (slower).",
                                                 rich_help_panel="Distributed")] = False,
        details: DetailsOpt = False,
    ) -> None:
        import os
        import sys

        from torchdoctor.runner import RunRequest, run_command

        passed = {"--nnodes": nnodes, "--node-rank": node_rank, "--master-addr": master_addr,
                  "--master-port": master_port, "--rdzv-backend": rdzv_backend, "--rdzv-endpoint": rdzv_endpoint,
                  "--rdzv-id": rdzv_id, "--rdzv-conf": rdzv_conf}
        rendezvous = [item for name, value in passed.items() if value is not None for item in (name, value)]
        if standalone:
            rendezvous.append("--standalone")

        if compile_backend is not None:
            if compile_backend not in COMPILE_BACKENDS:
                sys.stderr.write(f"torchdoctor: --compile-backend {compile_backend!r}: choose one of: "
                                 f"{', '.join(COMPILE_BACKENDS)}\n")
                raise typer.Exit(2)
            os.environ["TORCHDOCTOR_COMPILE_BACKEND"] = compile_backend  # read by the compile probe in the script

        request = RunRequest(
            target=list(target or []),
            module=module,
            steps=steps,
            timeout=timeout,
            hang_timeout=hang_timeout,
            probes=list(probe or []),
            gpu_memory=gpu_memory,
            out=out,
            fmt=fmt,
            fail_on=fail_on,
            nproc_per_node=nproc_per_node,
            rendezvous=rendezvous,
            ddp_debug=ddp_debug,
            details=details,
        )
        raise typer.Exit(run_command(request))
