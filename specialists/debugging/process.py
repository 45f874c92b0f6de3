"""The process rather than the model: hangs, crashed DataLoader workers and native crashes, CUDA that is
not there, and runs that measured nothing (or whose probes failed).
"""

from __future__ import annotations

from torchdoctor.model import Fix
from torchdoctor.specialists.base import Advice, Case
from torchdoctor.specialists.debugging.shared import SPECIALIST
from torchdoctor.specialists.memory import SHM_SIGNATURES
from torchdoctor.specialists.units import secs


@SPECIALIST.handles("hang")
def hang(case: Case) -> Advice:
    seconds = case.num("seconds")
    stuck = case.text("stuck_in")
    where = case.at()
    facts = "The script stopped making progress"
    if seconds is not None:
        facts += f": no optimizer step for {secs(seconds)}"
    if stuck:
        facts += f", blocked in `{stuck}`"
    if where:
        facts += f" at {where}"
    facts += "."
    return Advice(
        facts,
        [
            Fix(
                title="Give DataLoader workers a timeout and rule them out",
                snippet="loader = DataLoader(ds, batch_size=64, num_workers=4, timeout=120)\n"
                "# to test: num_workers=0 runs __getitem__ in the main process",
                why="A worker blocked on I/O, a lock inherited through fork, or a crashed worker leaves the main "
                "process waiting for a batch forever; a timeout turns it into an error.",
                verify="With num_workers=0 the script advances (the hang is in the workers) or not (it is elsewhere).",
                location=case.location,
            ),
            Fix(
                title="Start workers with spawn when the main process uses threads",
                snippet="DataLoader(ds, num_workers=4, multiprocessing_context='spawn')",
                why="fork copies locks held by other threads (logging, tokenizers, OpenMP) in the locked state.",
                verify="The hang no longer reproduces.",
                applies_when="The dataset uses threaded libraries or the main process starts threads before the loader.",
            ),
        ],
        [
            f"`torchdoctor run --hang-timeout 30 {case.script}` dumps every thread's stack when no step completes for 30 s.",
            "`py-spy dump --pid <pid>` shows where a running process is stuck, without stopping it.",
        ],
    )


_WORKER_CAUSES = {
    "worker-pickle-local": "the dataset, collate_fn or worker_init_fn is a local function or lambda, which "
    "cannot be pickled to start workers with spawn",
    "worker-pickle-lambda": "a lambda cannot be pickled to start workers with spawn",
    "spawn-bootstrap": "the script starts DataLoader workers at import time without an `if __name__ == '__main__':` guard",
    "dataloader-too-many-open-files": "the workers ran out of file descriptors passing tensors through shared memory",
    "dataloader-worker-exception": "__getitem__ or collate_fn raised inside a worker",
}


@SPECIALIST.handles("dataloader-worker-error")
def worker_error(case: Case) -> Advice:
    cause = next((text for src, text in _WORKER_CAUSES.items() if src in case.sources), None)
    exc = case.text("exception")
    worker = case.num("worker_id")
    code = case.num("exit_code")
    facts = "DataLoader workers failed"
    if worker is not None:
        facts = f"DataLoader worker {worker:.0f} failed"
    if exc:
        facts += f" with `{exc}`"
    if code is not None:
        facts += f" (exit code {code:.0f})"
    facts += f": {cause}." if cause else "."
    fixes = [
        Fix(
            title="Reproduce in the main process for a full traceback",
            snippet="loader = DataLoader(ds, batch_size=64, num_workers=0)\nnext(iter(loader))",
            why="With num_workers=0 __getitem__ runs in the main process and its exception shows your line.",
            verify="The error (if it is in your dataset) now points at the line in __getitem__ or collate_fn.",
            location=case.location,
        ),
        Fix(
            title="Use picklable, module-level callables and a main guard",
            snippet=(
                "def collate(batch):            # module level, not a lambda or nested function\n"
                "    return torch.utils.data.default_collate(batch)\n\n"
                "def main():\n"
                "    loader = DataLoader(ds, num_workers=4, collate_fn=collate)\n"
                "    ...\n\n"
                "if __name__ == '__main__':\n"
                "    main()"
            ),
            why="With the spawn start method (macOS, Windows, or multiprocessing_context='spawn') workers re-import the "
            "script and unpickle the dataset and callables.",
            verify="Workers start with num_workers > 0.",
        ),
        Fix(
            title="Share tensors through files when descriptors run out",
            snippet="import torch.multiprocessing\ntorch.multiprocessing.set_sharing_strategy('file_system')",
            why="The default file_descriptor strategy keeps one descriptor per shared tensor.",
            verify="No 'Too many open files' over an epoch.",
            applies_when="The error mentions open files or shared memory.",
        ),
    ]
    if cause and ("pickle" in cause or "guard" in cause):
        fixes.insert(0, fixes.pop(1))
    if cause and "descriptors" in cause:
        fixes.insert(0, fixes.pop())
    elif case.sources & SHM_SIGNATURES:
        fixes.pop()  # a full /dev/shm: the memory specialist gives the file_system strategy with its own fixes
    return Advice(facts, fixes, [f"`{case.run_cmd('data', extra='--steps 5')}` records each DataLoader's settings and call site."])


@SPECIALIST.handles("cuda-unavailable")
def cuda_unavailable(case: Case) -> Advice:
    driver = case.num("driver_version")
    gpu = case.text("gpu")
    cap = case.text("capability")
    facts = "CUDA cannot be used in this process"
    if "cuda-not-compiled" in case.sources:
        facts = "This torch build has no CUDA support (a CPU-only wheel)"
    elif driver is not None:
        facts = f"The NVIDIA driver (version {driver:.0f}) is too old for this torch build's CUDA runtime"
    elif gpu and cap:
        facts = f"This torch build has no kernels for {gpu} (compute capability {cap})"
    elif "invalid-device-ordinal" in case.sources:
        facts = "The script asks for a GPU index that does not exist in this process (check CUDA_VISIBLE_DEVICES and LOCAL_RANK)"
    facts += "."
    return Advice(
        facts,
        [
            Fix(
                title="Check what torch and the driver see",
                snippet="python -c \"import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available(), torch.cuda.device_count())\"",
                why="CPU-only builds report no CUDA version in torch.version.cuda; nvidia-smi shows the driver and the highest CUDA version it supports.",
                verify="torch.cuda.is_available() is True and device_count() matches the GPUs you expect.",
            ),
            Fix(
                title="Install the torch build that matches the GPU and driver",
                snippet="nvidia-smi   # driver version and supported CUDA version",
                why="Pick the CUDA variant of the wheel from pytorch.org's install selector that your driver supports; "
                "very new or very old GPUs need a build that includes their architecture.",
                verify="A tensor moves to the GPU: torch.ones(1).cuda().",
            ),
            Fix(
                title="Fall back cleanly when no GPU is present",
                snippet="device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')",
                why="Scripts that hard-code 'cuda' fail on CPU-only machines and CI.",
                verify="The script runs on a CPU-only machine.",
                location=case.location,
                applies_when="The script should also run without a GPU.",
            ),
        ],
        [f"`{case.run_cmd('env')}` reports torch, CUDA and driver versions and the visible devices."],
    )


@SPECIALIST.handles("native-crash")
def native_crash(case: Case) -> Advice:
    signal = case.text("signal")
    code = case.num("exit_code")
    after_last = case.value("after_last_step") is True
    where = case.at()
    facts = "The process died of a fatal signal"
    if signal:
        facts = f"The process died of {signal}"
    if code is not None:
        facts += f" (exit code {code:.0f})"
    if case.step is not None:
        facts += f" at step {case.step}"
    if where:
        facts += f"; the last Python frame of yours was {where}"
    if after_last:
        facts += ", after the last training step: the crash is in interpreter or library teardown, not in training"
    facts += ". A native crash bypasses Python's exception handling, so the traceback has to be asked for."
    return Advice(
        facts,
        [
            Fix(
                title="Get the Python stack of every thread at the crash",
                snippet=f"python -X faulthandler {case.script}",
                why="faulthandler prints each thread's Python traceback on SIGSEGV, SIGFPE, SIGABRT, SIGBUS and SIGILL.",
                verify="The crash output now ends with the Python line that called into native code.",
                location=case.location,
            ),
            Fix(
                title="Isolate the native code involved",
                snippet="loader = DataLoader(ds, batch_size=64, num_workers=0)   # rule out worker processes\n"
                "model = model.cpu()                                      # rule out the GPU stack",
                why="Workers forked after CUDA or OpenMP initialisation, extension modules built for another torch, "
                "and GPU drivers are the usual native suspects.",
                verify="The crash disappears with one of them removed, which names the culprit.",
            ),
            Fix(
                title="Check that every native package matches this torch",
                snippet="python -m torch.utils.collect_env",
                why="Extensions (custom CUDA ops, vision/audio packages) compiled against another torch version crash "
                "when loaded together.",
                verify="Companion packages report versions built for the installed torch.",
            ),
        ],
        [f"`{case.run_cmd(extra='--steps 20')}` records the signal, the step and your last frame."],
    )


@SPECIALIST.handles("probe-failed")
def probe_failed(case: Case) -> Advice:
    probe = case.text("probe") or "a"
    error = case.text("error") or "an error"
    at = case.text("at")
    step = case.num("step")
    when = f"at step {int(step)}" if step is not None else "before the first step"
    return Advice(
        f"The {probe} probe failed {when} ({error}) and was switched off: this report says nothing about what it "
        f"measures from then on, so the absence of a {probe} finding is not a clean bill.",
        [
            Fix(
                title=f"Report the {probe} probe's failure; the rest of the report stands",
                snippet=case.run_cmd(probe, extra="--steps 20"),
                why="The failure is torchdoctor's, not your script's: the script ran on unchanged, and the other "
                "probes' findings hold. The error" + (f" and the place it names ({at})" if at else "")
                + " are what a bug report needs; running the probe alone shows whether it reproduces.",
                verify=f"A run lists no probe-failed symptom for the {probe} probe.",
            )
        ],
        [f"`{case.run_cmd(probe)}` runs that probe alone on the same script."],
    )


@SPECIALIST.handles("nothing-measured")
def nothing_measured(case: Case) -> Advice:
    torch_seen = case.value("torch_imported")
    children = case.value("child_processes")
    if children:
        return Advice(
            f"The run measured no training in the script's own process: the script started {children} "
            f"process{'es' if children != 1 else ''} with multiprocessing (`{case.value('child_target')}`, "
            f"{', '.join(case.value('start_methods') or [])}) and the training ran there. torchdoctor's probes live "
            "in the process it starts and in torchrun's ranks, not in processes a script spawns or forks itself, "
            "so this report says nothing about that training either way.",
            [
                Fix(
                    title="Start the ranks with torchrun instead of spawning them from the script",
                    snippet=f"torchdoctor run --nproc-per-node 2 {case.script}   # Lightning: strategy=\"ddp\"\n"
                    f"torchdoctor run {case.script}   # or one process: devices=1 / no mp.spawn",
                    why="Under torchrun every rank runs the probes; Lightning's `ddp` strategy (not `ddp_spawn` or "
                    "`ddp_fork`) and a script that calls init_process_group itself use torchrun's ranks as they are.",
                    verify="The report's Run section counts optimizer steps for every rank.",
                    location=case.location,
                ),
            ],
            [f"`torchdoctor check {case.script}` reads the code without running it."],
        )
    backwards = case.value("backward_passes")
    if backwards:
        facts = (f"The run counted no optimizer step although {backwards} backward pass"
                 f"{'es' if backwards != 1 else ''} ran: the weights were updated without optimizer.step() of a "
                 "torch.optim optimizer (by hand, or by another library's optimizer), so the checks torchdoctor makes "
                 "at each step never ran. This report cannot vouch for that training.")
    elif torch_seen is False:
        facts = ("The run measured nothing: the process torchdoctor watched never imported torch, so no probe "
                 "was attached. A launcher that starts the training in another interpreter (a shell script, "
                 "`subprocess`, `accelerate launch` inside the script) hides it from the probes.")
    else:
        facts = ("The run measured no training: torch was imported, but no optimizer step, backward pass or model "
                 "forward was seen. A clean report from such a run would vouch for training it never watched.")
    return Advice(
        facts,
        [
            Fix(
                title="Point torchdoctor at the process that trains",
                snippet=f"torchdoctor run {case.script} -- <your arguments>\n"
                "torchdoctor run -- torchrun --nproc-per-node 2 train.py   # a torchrun line runs under the probes",
                why="The probes live in the process torchdoctor starts (and, through torchrun, in every rank); "
                "training started anywhere else is invisible to them.",
                verify="The report's Run section counts optimizer steps.",
            ),
            Fix(
                title="Let at least one optimizer step run",
                snippet=f"torchdoctor run --steps 20 {case.script}",
                why="A step is a call of optimizer.step() on a torch.optim optimizer (a framework's own loop calls "
                "it too). A script that only builds the model, or updates weights by hand without an optimizer, "
                "gives the step-based probes nothing to measure.",
                verify="steps_completed in report.json is above 0.",
                applies_when="The script's training loop is behind a flag or a configuration that was not given.",
            ),
        ],
        [f"`torchdoctor check {case.script}` reads the code without running it."],
    )


@SPECIALIST.handles("source-not-analysed")
def source_not_analysed(case: Case) -> Advice:
    reason = case.text("reason")
    where = case.at()
    path = case.location.path if case.location is not None else None
    facts = f"torchdoctor check could not analyse `{path}`" if path else "torchdoctor check could not analyse a file"
    if reason:
        facts += f" ({reason})"
    if where:
        facts += f", at {where}"
    facts += ": none of its rules ran on it."
    return Advice(
        facts,
        [
            Fix(
                title="Make the file parse as Python 3",
                snippet=f"python -m py_compile {path or case.script}",
                why="check reads the source without running it; a syntax error, a non-UTF-8 encoding or NUL bytes stop the parse.",
                verify="py_compile prints nothing and `torchdoctor check` reports findings for the file.",
                location=case.location,
            ),
            Fix(
                title="Or exclude files that are not meant to be analysed",
                snippet="# pyproject.toml\n[tool.torchdoctor]\nexclude = [\"legacy/\", \"generated/*.py\"]",
                why="Generated or Python 2 files are better skipped than reported every run.",
                verify="`torchdoctor check .` no longer lists them.",
                applies_when="For files outside your training code.",
            ),
        ],
        [f"`torchdoctor check {path or case.script}` after the fix."],
    )
