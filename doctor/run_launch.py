"""Distributed launches: the torchrun command line that starts the bootstrap in every rank.

Three ways in, one result (`Launch`):

- `torchdoctor run --nproc-per-node N [rendezvous options] train.py -- ARGS`
  builds `python -m torch.distributed.run --nproc-per-node N … train.py ARGS`
  (`--standalone`, a free port on this host, when no rendezvous option is given);
- `torchdoctor run -- torchrun [OPTIONS] train.py ARGS` (or `python -m
  torch.distributed.run …`) keeps the user's own options.

Either way the bootstrap is injected by rewriting the training-script
argument: `… -m torchdoctor.probes.bootstrap train.py ARGS` (torchrun's own
`-m` becomes the bootstrap's `-m`). Rewriting argv, not the environment
(sitecustomize, PYTHONSTARTUP), because only the ranks must run the probes:
the torchrun agent, DataLoader workers started with `spawn` and any other
Python the script starts share that environment. torchrun always runs with
torchdoctor's own interpreter (`sys.executable -m torch.distributed.run`), so
the ranks can import the bootstrap.

torchrun's options are read from a table, not by importing torch (the parent
never imports it). No torch here.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

TORCHRUN_MODULE = "torch.distributed.run"
ACCELERATE_MODULE = "accelerate.commands.launch"
LAUNCHER_MODULES = (TORCHRUN_MODULE, ACCELERATE_MODULE)
BOOTSTRAP = "torchdoctor.probes.bootstrap"

# accelerate launch's options that take no value (accelerate 1.x, commands/launch.py: store_true); every
# other option takes one. accelerate accepts '-' and '_' spellings and no abbreviations.
_ACCELERATE_FLAGS = {
    "--cpu", "--debug", "--downcast_bf16", "--dynamo_use_dynamic", "--dynamo_use_fullgraph",
    "--dynamo_use_regional_compilation", "--enable_cpu_affinity", "--fp8_use_autocast_during_eval",
    "--multi_gpu", "--no_tpu_cluster", "--quiet", "-q", "--same_network", "--tpu", "--tpu_cluster",
    "--tpu_use_sudo", "--use_deepspeed", "--use_fsdp", "--use_megatron_lm", "--use_parallelism_config",
}

# torchrun's options that take no value (argparse store_true), long and short forms.
_FLAGS = {"--standalone", "-m", "--module", "--no-python", "--no_python", "--run-path", "--run_path",
          "--virtual-local-rank", "--virtual_local_rank", "-h", "--help"}
# Options that take a value (torch 2.13's torch/distributed/run.py), '-' and '_' spellings.
_VALUED = {
    "--nnodes", "--nproc-per-node", "--rdzv-backend", "--rdzv-endpoint", "--rdzv-id", "--rdzv-conf",
    "--max-restarts", "--monitor-interval", "--start-method", "--event-log-handler", "--role", "--log-dir",
    "-r", "--redirects", "-t", "--tee", "--local-ranks-filter", "--duplicate-stdout-filters",
    "--duplicate-stderr-filters", "--node-rank", "--master-addr", "--master-port", "--local-addr",
    "--logs-specs", "--numa-binding", "--signals-to-handle", "--shutdown-timeout",
}
_VALUED |= {name.replace("-", "_").replace("__", "--", 1) for name in _VALUED if name.startswith("--")}
# Options that choose the rendezvous: without any of them our own launch adds --standalone.
RENDEZVOUS = ("--nnodes", "--node-rank", "--master-addr", "--master-port", "--rdzv-backend", "--rdzv-endpoint",
              "--rdzv-id", "--rdzv-conf", "--standalone")
_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")
_NPROC = re.compile(r"^(\d+|auto|cpu|gpu|xpu)$")


class LaunchError(ValueError):
    """A launcher line torchdoctor cannot start: one sentence for the user (exit code 2)."""


@dataclass
class Launch:
    """A torchrun job with the bootstrap in every rank."""

    options: list[str]  # torchrun's own options, without -m/--module
    module: bool  # the target is a module (torchrun -m)
    target: str  # the training script as typed, or the module name
    args: list[str]  # the script's own arguments
    typed: list[str] = field(default_factory=list)  # the command as the user would type it without torchdoctor
    launcher: str = "torchrun"  # or "accelerate" (accelerate launch)

    def argv(self) -> list[str]:
        target = ["-m", self.target] if self.module else [self.target]
        if self.launcher == "accelerate":
            return [sys.executable, "-m", ACCELERATE_MODULE, *self.options, "--module", BOOTSTRAP, *target,
                    *self.args]
        return [sys.executable, "-m", TORCHRUN_MODULE, *self.options, "-m", BOOTSTRAP, *target, *self.args]

    def option(self, name: str) -> str | None:
        """The value of one of torchrun's options as given (either spelling), or None."""
        names = {name, name.replace("-", "_").replace("__", "--", 1)}
        value = None
        for i, item in enumerate(self.options):
            key, eq, attached = item.partition("=")
            if key in names:
                value = attached if eq else (self.options[i + 1] if i + 1 < len(self.options) else "")
        return value

    def rendezvous(self) -> dict[str, str]:
        """Where this node's agent meets the others: nnodes, node_rank, endpoint (as given; absent if not)."""
        if self.launcher == "accelerate":  # accelerate's names for the same three
            ip, port = self.option("--main-process-ip"), self.option("--main-process-port")
            found = {"nnodes": self.option("--num-machines"), "node_rank": self.option("--machine-rank"),
                     "endpoint": f"{ip}:{port or 29500}" if ip else None}
            return {key: value for key, value in found.items() if value}
        endpoint = self.option("--rdzv-endpoint")
        if not endpoint and self.option("--master-addr"):
            endpoint = f"{self.option('--master-addr')}:{self.option('--master-port') or 29500}"
        found = {"nnodes": self.option("--nnodes"), "node_rank": self.option("--node-rank"), "endpoint": endpoint}
        return {key: value for key, value in found.items() if value}

    @property
    def node_rank(self) -> int:
        try:
            return int(self.option("--machine-rank" if self.launcher == "accelerate" else "--node-rank") or 0)
        except ValueError:
            return 0


def launcher_of(words: list[str], cwd: str) -> str | None:
    """"torchrun" for `torchrun …` or `python -m torch.distributed.run …`, "accelerate" for `accelerate launch
    …` or `python -m accelerate.commands.launch …`, else None (also for a script that happens to be named so)."""
    if not words:
        return None
    head = os.path.basename(words[0])
    if os.path.isfile(os.path.join(cwd, words[0])) and head in ("torchrun", "accelerate"):
        return None
    if head == "torchrun":
        return "torchrun"
    if head == "accelerate" and words[1:2] == ["launch"]:
        return "accelerate"
    if _PYTHON.match(head) or os.path.realpath(words[0]) == os.path.realpath(sys.executable):
        for module, name in ((TORCHRUN_MODULE, "torchrun"), (ACCELERATE_MODULE, "accelerate")):
            if words[1:3] == ["-m", module] or words[1:2] == [f"-m{module}"]:
                return name
    return None


def is_launcher_line(words: list[str], cwd: str) -> bool:
    """A torchrun or accelerate launch line (see `launcher_of`)."""
    return launcher_of(words, cwd) is not None


def _canonical(name: str) -> str:
    """An option as torchrun's argparse would resolve it: exact, or a unique prefix of a long option."""
    if name in _FLAGS or name in _VALUED or not name.startswith("--"):
        return name
    matches = {n.replace("_", "-") for n in _FLAGS | _VALUED if n.startswith(name)}
    return matches.pop() if len(matches) == 1 else name


@dataclass(frozen=True)
class _Grammar:
    """What one launcher's command line means: how an option is spelled canonically, which options are
    flags, which are refused (with why), and whether an unknown option takes the next word as its value."""

    launcher: str
    name_of: Callable[[str], str]
    flags: frozenset[str]
    refused: dict[str, str]
    takes_value: Callable[[str, list[str], int, str, bool], bool]


def _torchrun_takes_value(name: str, rest: list[str], i: int, cwd: str, module: bool) -> bool:
    if name[:2] in ("-r", "-t") and len(name) > 2 and not name.startswith("--"):
        return False  # -r3: argparse's attached short value
    return name in _VALUED or i + 1 < len(rest) and not _looks_like_target(rest[i + 1], cwd, module)


_TORCHRUN = _Grammar(
    launcher="torchrun", name_of=_canonical, flags=frozenset(_FLAGS),
    refused={
        **dict.fromkeys(("-h", "--help"), "torchrun --help: run it without torchdoctor"),
        **dict.fromkeys(("--no-python", "--no_python"), "torchrun --no-python starts a program that is not Python: "
                        "torchdoctor can probe only Python training scripts"),
        **dict.fromkeys(("--run-path", "--run_path"), "torchrun --run-path runs the script inside torchrun's own "
                        "interpreter, where the probes cannot be injected: drop --run-path"),
    },
    takes_value=_torchrun_takes_value,
)


def _accelerate_name(item: str) -> str:
    """An accelerate option as its parser knows it: '--num-processes' -> '--num_processes'."""
    return "--" + item[2:].replace("-", "_") if item.startswith("--") else item


_ACCELERATE = _Grammar(
    launcher="accelerate", name_of=_accelerate_name, flags=frozenset(_ACCELERATE_FLAGS),
    refused={
        **dict.fromkeys(("-h", "--help"), "accelerate launch --help: run it without torchdoctor"),
        "--no_python": "accelerate launch --no_python starts a program that is not Python: torchdoctor can "
                       "probe only Python training scripts",
    },
    takes_value=lambda name, rest, i, cwd, module: i + 1 < len(rest),
)


def parse_launcher_line(words: list[str], cwd: str) -> Launch:
    """Split the user's launcher line into the launcher's options, the script and its arguments."""
    if launcher_of(words, cwd) == "accelerate":
        grammar = _ACCELERATE
        rest = words[2:] if os.path.basename(words[0]) == "accelerate" else words[3 if words[1] == "-m" else 2:]
    else:
        grammar = _TORCHRUN
        rest = words[1:] if os.path.basename(words[0]) == "torchrun" else words[3 if words[1] == "-m" else 2:]
    options: list[str] = []
    module = False
    i = 0
    while i < len(rest):
        item = rest[i]
        if item == "--":
            i += 1
            break
        if not item.startswith("-") or item == "-":
            break
        key, eq, _ = item.partition("=")
        name = grammar.name_of(key)
        if name in grammar.refused:
            raise LaunchError(grammar.refused[name])
        if name in ("-m", "--module"):
            module = True
            i += 1
            continue
        if not eq and name not in grammar.flags and grammar.takes_value(name, rest, i, cwd, module):
            options += rest[i:i + 2]
            i += 2
        else:  # a flag, an option with its value attached, or one this table does not know before the script
            options.append(item)
            i += 1
    if i >= len(rest):
        raise LaunchError(f"no training script in the launcher line: {' '.join(words)}")
    if grammar is _ACCELERATE and importlib.util.find_spec("accelerate") is None:
        raise LaunchError(f"accelerate launch needs accelerate in this Python ({sys.executable})")
    return Launch(options=options, module=module, target=rest[i], args=rest[i + 1:], typed=list(words),
                  launcher=grammar.launcher)


def _looks_like_target(word: str, cwd: str, module: bool) -> bool:
    return os.path.exists(os.path.join(cwd, word)) or word.endswith(".py") or (module and not word.startswith("-"))


def own_launch(nproc: str, rendezvous: list[str], module: str | None, script: str | None,
               args: list[str]) -> Launch:
    """`--nproc-per-node N` and the rendezvous options given to torchdoctor -> a torchrun job."""
    if not _NPROC.match(nproc) or nproc == "0":
        raise LaunchError(f"--nproc-per-node {nproc!r}: give a number of processes (or auto, cpu, gpu)")
    given = {item.partition("=")[0].replace("_", "-") for item in rendezvous if item.startswith("--")}
    options = ["--nproc-per-node", nproc, *rendezvous]
    if not given & set(RENDEZVOUS):
        options.append("--standalone")  # one node: torchrun picks a free port itself
    target = module if module else str(script)
    typed = ["torchrun", *options, *(["-m"] if module else []), target, *args]
    return Launch(options=options, module=module is not None, target=target, args=list(args), typed=typed)


def torch_available() -> bool:
    """Is torch importable by this interpreter (found, not imported)?"""
    return importlib.util.find_spec("torch") is not None
