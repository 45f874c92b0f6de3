"""`torchdoctor run` options -> a checked plan: what to start, where evidence goes, which probes.

Every mistake in the command line is a `UsageError` with one clear sentence
(exit code 2), found before anything is started; nothing of the user's is
touched. No torch here.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from torchdoctor.notebook import Notebook, NotebookError, read_notebook
from torchdoctor.run_files import ForeignFile, claim
from torchdoctor.run_launch import (
    LAUNCHER_MODULES,
    Launch,
    LaunchError,
    is_launcher_line,
    own_launch,
    parse_launcher_line,
    torch_available,
)

FORMATS = ("text", "json", "markdown")
FAIL_ON = ("error", "warning", "never")
class UsageError(Exception):
    """A mistake in the command line: one sentence for the user, exit code 2."""


@dataclass
class RunRequest:
    """The command line as typed."""

    target: list[str] = field(default_factory=list)  # SCRIPT [ARGS…], or ARGS… with --module
    module: str | None = None
    steps: int | None = None
    timeout: float | None = None
    hang_timeout: float | None = None
    probes: list[str] = field(default_factory=list)
    gpu_memory: str | None = None
    out: str | None = None
    fmt: str = "text"
    fail_on: str = "error"
    nproc_per_node: str | None = None  # launch through torchrun with N processes on this node
    rendezvous: list[str] = field(default_factory=list)  # torchrun's rendezvous options, passed through
    ddp_debug: bool = False  # TORCH_DISTRIBUTED_DEBUG=DETAIL in every rank
    details: bool = False  # text: the full report after the summary


@dataclass
class RunPlan:
    script: str | None  # as typed
    module: str | None
    args: list[str]
    project: str  # the script's directory, or the working directory for -m
    run_dir: Path
    probes: list[str]
    steps: int | None
    timeout_s: float | None
    hang_timeout_s: float | None  # None: no watchdog
    gpu_memory_gib: float | None
    fmt: str
    fail_on: str
    cwd: str
    thresholds: dict[str, Any]
    launch: Launch | None = None  # a torchrun job (run_launch.py); None: one process
    ddp_debug: bool = False
    notebook: Notebook | None = None  # the script is a .ipynb: its cells, converted into the run directory
    label: str | None = None  # in-process sessions (torchdoctor.watch): what the report names as the target
    hang_gap_factor: float = 0.0  # >0: the default timeout, widened to this many times the run's longest quiet spell
    details: bool = False  # text: the full report after the summary

    @property
    def child_cwd(self) -> str:
        """Where the script runs: the working directory; a notebook's own folder, as a Jupyter kernel."""
        return self.notebook.folder if self.notebook is not None else self.cwd

    @property
    def distributed(self) -> bool:
        return self.launch is not None

    @property
    def multinode(self) -> bool:
        """A job over more than one node (--nnodes N or MIN:MAX with a maximum above 1; --num_machines N)."""
        if self.launch is None:
            return False
        nnodes = self.launch.option("--nnodes") or self.launch.option("--num-machines")  # accelerate's name
        try:
            return nnodes is not None and int(nnodes.rpartition(":")[2]) > 1
        except ValueError:
            return False

    @property
    def display_target(self) -> str:
        if self.label is not None:
            return self.label
        return f"-m {self.module}" if self.module else str(self.script)

    @property
    def user_command(self) -> list[str]:
        """The command this run stands for, as the user would type it without torchdoctor."""
        if self.launch is not None:
            return list(self.launch.typed)
        if self.label is not None:  # in-process: the block ran inside whatever the user started
            return ["python", str(self.script)] if self.script else []
        if self.notebook is not None:
            return ["jupyter", "execute", str(self.script), *self.args]
        head = ["python", "-m", self.module] if self.module else ["python", str(self.script)]
        return head + self.args

    def child_argv(self) -> list[str]:
        if self.launch is not None:
            return self.launch.argv()
        target = ["-m", self.module] if self.module else [self.notebook.path if self.notebook else str(self.script)]
        return [sys.executable, "-m", "torchdoctor.probes.bootstrap", *target, *self.args]

    def child_config(self) -> dict[str, Any]:
        """What reaches the bootstrap through TORCHDOCTOR_RUN (JSON)."""
        config: dict[str, Any] = {
            "v": 1,
            "run_dir": str(self.run_dir),
            "probes": self.probes,
            "steps": self.steps,
            "project": self.project,
            "options": {name: self.thresholds.get(name, {}).get("instrument", {}) for name in self.probes},
        }
        if self.notebook is not None:
            config["notebook"] = self.notebook.config()  # run cell by cell (probes/notebook.py)
        if self.launch is not None:
            config["launcher"] = "torchrun"  # the bootstrap records each rank's exit status (bootstrap.py)
        return config


def parse_size_gib(text: str) -> float:
    """`--gpu-memory`: a card (`3090`, `A100-80GB`) or a size (`10GiB`, `24GB`, `8000MiB`, `12`) -> GiB.
    Read as `fit --gpu` reads it (doctor/fit/gpus.py): GB and GiB alike, as GPU memory is sold."""
    from torchdoctor.fit import gpus

    named = gpus.card(text)
    size = named["bytes"] if named is not None else gpus.size_bytes(text)
    if size is None:
        raise UsageError(f"--gpu-memory {text!r} is not a size or a known GPU; write it like 10GiB, 24GB, "
                         "8000MiB or 3090")
    return size / 2**30


def _probes(selected: list[str]) -> list[str]:
    from torchdoctor.probes import defaults, names

    if not selected:
        return defaults()
    chosen: list[str] = []
    for item in selected:
        for name in (part.strip() for part in item.split(",")):
            if not name:
                continue
            if name == "none":
                return []
            if name == "all":
                chosen += [n for n in names() if n not in chosen]
            elif name in names():
                if name not in chosen:
                    chosen.append(name)
            else:
                raise UsageError(f"unknown probe {name!r}; choose from: {', '.join(names())} (or all, none)")
    return chosen


def _module_exists(name: str, cwd: str) -> bool:
    """Find `name` the way `python -m` would, without importing (executing) anything."""
    parts = name.split(".")
    if not all(p.isidentifier() for p in parts):
        return False
    path = [cwd, *sys.path[1:]]
    spec = None
    for i, part in enumerate(parts):
        spec = importlib.machinery.PathFinder.find_spec(part if i == 0 else ".".join(parts[: i + 1]), path)
        if spec is None:
            return i == 0 and part in sys.builtin_module_names
        path = list(spec.submodule_search_locations or [])
    return spec is not None


def runs_base(cwd: str) -> Path:
    """`.torchdoctor` under `cwd`, made on first use with a .gitignore that keeps every run out of git."""
    base = Path(cwd) / ".torchdoctor"
    if not base.exists():
        try:
            base.mkdir(exist_ok=True)  # exist_ok: the ranks of one job may race here
            (base / ".gitignore").write_text("# torchdoctor run directories\n*\n", encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"cannot create {base}: {exc.strerror}") from None
    return base


def _run_dir(out: str | None, cwd: str) -> Path:
    if out:
        run_dir = Path(out).expanduser()
        if not run_dir.is_absolute():
            run_dir = Path(cwd) / run_dir
        if run_dir.exists() and not run_dir.is_dir():
            raise UsageError(f"--out {out}: exists and is not a directory")
    else:
        base = runs_base(cwd)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        run_dir = base / "runs" / stamp
        n = 1
        while run_dir.exists():
            n += 1
            run_dir = base / "runs" / f"{stamp}-{n}"
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create the run directory {run_dir}: {exc.strerror}") from None
    if not os.access(run_dir, os.W_OK):
        raise UsageError(f"cannot write to the run directory {run_dir}")
    try:
        claim(run_dir)  # a previous run's evidence, proven by its manifest, and never anything else
    except ForeignFile as exc:
        raise UsageError(f"--out {out}: {exc}; a run would replace it, so move it away or choose another "
                         "--out") from None
    except OSError as exc:
        raise UsageError(f"cannot prepare the run directory {run_dir}: {exc.strerror}") from None
    return run_dir


def make_plan(req: RunRequest, cwd: str | None = None) -> RunPlan:
    from torchdoctor.rules import catalog

    cwd = cwd or os.getcwd()
    if req.fmt not in FORMATS:
        raise UsageError(f"unknown format {req.fmt!r}; choose one of: {', '.join(FORMATS)}")
    if req.fail_on not in FAIL_ON:
        raise UsageError(f"--fail-on {req.fail_on!r}: choose one of: {', '.join(FAIL_ON)}")
    if req.steps is not None and req.steps < 1:
        raise UsageError("--steps must be at least 1")
    if req.timeout is not None and req.timeout <= 0:
        raise UsageError("--timeout must be more than 0 seconds")
    if req.hang_timeout is not None and req.hang_timeout < 0:
        raise UsageError("--hang-timeout must be 0 (off) or more seconds")
    thresholds = catalog.load_toml("thresholds.toml")
    probes = _probes(req.probes)
    gpu = parse_size_gib(req.gpu_memory) if req.gpu_memory is not None else None

    if req.module in LAUNCHER_MODULES:  # `run -m accelerate.commands.launch …`: the launcher line, typed so
        req = replace(req, module=None, target=[sys.executable, "-m", req.module, *req.target])
    args = list(req.target)
    launch: Launch | None = None
    if is_launcher_line(args, cwd):
        if req.nproc_per_node is not None or req.rendezvous or req.module:
            raise UsageError("give either torchdoctor's --nproc-per-node/-m/rendezvous options or your own "
                             "launcher line (torchrun, accelerate launch) after --, not both")
        try:
            launch = parse_launcher_line(args, cwd)
        except LaunchError as exc:
            raise UsageError(str(exc)) from None
        req = _target_of(req, launch)
        args = list(req.target)
    elif req.rendezvous and req.nproc_per_node is None:
        raise UsageError("rendezvous options (--nnodes, --node-rank, --master-addr, --master-port, --rdzv-*, "
                         "--standalone) need --nproc-per-node")
    script: str | None = None
    notebook: Notebook | None = None
    if req.module:
        if not _module_exists(req.module, cwd):
            raise UsageError(f"no module named {req.module!r} (looked in {cwd} and the Python path)")
        project = cwd
    else:
        if not args:
            raise UsageError("missing the script to run: torchdoctor run train.py [OPTIONS] [-- SCRIPT ARGS]")
        script = args.pop(0)
        path = Path(cwd) / script
        if not path.exists():
            raise UsageError(f"no such script: {script}")
        if path.is_dir() and not (path / "__main__.py").exists():
            raise UsageError(f"{script} is a directory without __main__.py")
        if not os.access(path, os.R_OK):
            raise UsageError(f"cannot read {script}")
        project = str(path.resolve().parent if path.is_file() else path.resolve())
        if path.is_file() and path.suffix == ".ipynb":
            try:
                notebook = read_notebook(path)
            except NotebookError as exc:
                raise UsageError(str(exc)) from None

    if req.nproc_per_node is not None:
        try:
            launch = own_launch(req.nproc_per_node, list(req.rendezvous), req.module, script, args)
        except LaunchError as exc:
            raise UsageError(str(exc)) from None
    if launch is not None and not torch_available():
        raise UsageError(f"a distributed run needs torch in this Python ({sys.executable}): torchrun is "
                         "torch.distributed.run")
    if notebook is not None and launch is not None:
        raise UsageError(f"{script} is a notebook: a distributed run needs a script (export it with "
                         f"`jupyter nbconvert --to script {script}`)")
    if req.ddp_debug and launch is None:
        raise UsageError("--ddp-debug needs a distributed run (--nproc-per-node N, or a torchrun line after --)")

    hang = req.hang_timeout if req.hang_timeout is not None else float(thresholds["run"]["hang_timeout_s"])
    run_dir = _run_dir(req.out, cwd)
    if notebook is not None:
        try:
            notebook.write(run_dir)
        except OSError as exc:
            raise UsageError(f"cannot write the converted notebook to {run_dir}: {exc.strerror or exc}") from None
    return RunPlan(
        script=script,
        module=req.module,
        args=args,
        project=project,
        run_dir=run_dir,
        probes=probes,
        steps=req.steps,
        timeout_s=req.timeout,
        hang_timeout_s=hang or None,
        hang_gap_factor=float(thresholds["run"]["hang_gap_factor"]) if req.hang_timeout is None else 0.0,
        gpu_memory_gib=gpu,
        fmt=req.fmt,
        fail_on=req.fail_on,
        cwd=cwd,
        thresholds=thresholds,
        launch=launch,
        ddp_debug=req.ddp_debug,
        notebook=notebook,
        details=req.details,
    )


def watch_plan(probes: list[str], steps: int | None, out: str | None, cwd: str, script: str | None,
               label: str) -> RunPlan:
    """The plan of an in-process session (torchdoctor.watch): the same checks and run directory as `run`.

    `script` is the file that called watch() when it is a real file (its static findings join the
    report, as for `run`), else None (a notebook cell, the interactive prompt)."""
    from torchdoctor.rules import catalog

    if steps is not None and (not isinstance(steps, int) or isinstance(steps, bool) or steps < 1):
        raise UsageError("steps must be a whole number of at least 1")
    project = str(Path(script).resolve().parent) if script else cwd
    return RunPlan(
        script=script,
        module=None,
        args=[],
        project=project,
        run_dir=_run_dir(out, cwd),
        probes=_probes(list(probes)),
        steps=steps,
        timeout_s=None,
        hang_timeout_s=None,
        gpu_memory_gib=None,
        fmt="text",
        fail_on="never",
        cwd=cwd,
        thresholds=catalog.load_toml("thresholds.toml"),
        label=label,
    )


def _target_of(req: RunRequest, launch: Launch) -> RunRequest:
    """The request as if the launcher line's script (or module) had been given to torchdoctor directly."""
    if launch.module:
        return replace(req, module=launch.target, target=list(launch.args))
    return replace(req, target=[launch.target, *launch.args])
