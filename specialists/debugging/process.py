"""The process rather than the model: hangs, crashed DataLoader workers and native crashes, CUDA that is
not there, and runs that measured nothing (or whose probes failed).
"""

from __future__ import annotations

from torchdoctor.specialists import advice
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
            advice.fix("debugging", "worker-timeout", location=case.location),
            advice.fix("debugging", "spawn-workers"),
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
        advice.fix("debugging", "num-workers-0", location=case.location),
        advice.fix("debugging", "picklable-callables"),
        advice.fix("debugging", "file-system-sharing"),
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
            advice.fix("debugging", "check-cuda-visibility"),
            advice.fix("debugging", "matching-torch-build"),
            advice.fix("debugging", "cpu-fallback", location=case.location),
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
            advice.fix("debugging", "faulthandler", location=case.location, script=case.script),
            advice.fix("debugging", "isolate-native-code"),
            advice.fix("debugging", "matching-native-packages"),
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
    place = f" and the place it names ({at})" if at else ""
    return Advice(
        f"The {probe} probe failed {when} ({error}) and was switched off: this report says nothing about what it "
        f"measures from then on, so the absence of a {probe} finding is not a clean bill.",
        [
            advice.fix("debugging", "report-probe-failure", probe=probe, place=place,
                       command=case.run_cmd(probe, extra="--steps 20"))
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
                advice.fix("debugging", "torchrun-not-spawn", location=case.location, script=case.script),
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
            advice.fix("debugging", "point-at-training-process", script=case.script),
            advice.fix("debugging", "let-one-step-run", script=case.script),
        ],
        [f"`torchdoctor check {case.script}` reads the code without running it."],
    )


@SPECIALIST.handles("source-not-analysed")
def source_not_analysed(case: Case) -> Advice:
    reason = case.text("reason")
    where = case.at()
    path = case.location.path if case.location is not None else None
    target = path or case.script
    facts = f"torchdoctor check could not analyse `{path}`" if path else "torchdoctor check could not analyse a file"
    if reason:
        facts += f" ({reason})"
    if where:
        facts += f", at {where}"
    facts += ": none of its rules ran on it."
    return Advice(
        facts,
        [
            advice.fix("debugging", "make-file-parse", location=case.location, target=target),
            advice.fix("debugging", "exclude-unparsable-files"),
        ],
        [f"`torchdoctor check {target}` after the fix."],
    )
