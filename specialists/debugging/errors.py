"""Errors a traceback names in autograd and tensor code: in-place modification, a second backward, a
device-side assert, dtype, device and index errors, deprecated APIs, and the debugging side of a
torch.compile failure.
"""

from __future__ import annotations

from torchdoctor.specialists import advice
from torchdoctor.specialists.base import Advice, Case
from torchdoctor.specialists.debugging.shared import SPECIALIST


@SPECIALIST.handles("inplace-modification")
def inplace(case: Case) -> Advice:
    op = case.text("grad_fn", "op")
    version = case.num("version")
    expected = case.num("expected_version")
    shape = case.text("tensor_shape")
    facts = "A tensor autograd saved for backward was modified in place after it was saved"
    if op:
        facts += f" (a {shape} tensor, output of {op}" if shape else f" (it is the output of {op}"
        if version is not None and expected is not None:
            facts += f", now at version {version:.0f} instead of {expected:.0f}"
        facts += ")"
    where = case.at()
    if where:
        facts += f"; the in-place op is at {where}"
    facts += "."
    return Advice(
        facts,
        [
            advice.fix("debugging", "out-of-place-op", location=case.location),
        ],
        [
            "Run the failing step under anomaly mode: its error adds the traceback of the forward op whose saved "
            "tensor was modified:\nwith torch.autograd.detect_anomaly():\n    loss = criterion(model(x), y)\n    loss.backward()"
        ],
    )


@SPECIALIST.handles("backward-twice")
def backward_twice(case: Case) -> Advice:
    where = case.at()
    facts = "backward() ran through a graph whose saved tensors were already freed by an earlier backward"
    facts += f" (at {where})." if where else "."
    facts += " Usually a tensor from the previous step (a hidden state, a cached embedding, a running loss) is reused."
    return Advice(
        facts,
        [
            advice.fix("debugging", "detach-carried-state", location=case.location),
            advice.fix("debugging", "one-backward"),
            advice.fix("debugging", "retain-graph-on-purpose"),
        ],
        [f"`{case.check_cmd('TD6')}` and `{case.run_cmd('memory', extra='--steps 10')}` show tensors kept across steps."],
    )


@SPECIALIST.handles("device-side-assert")
def device_assert(case: Case) -> Advice:
    where = case.at()
    kernel = case.text("kernel")
    facts = (
        "A CUDA kernel hit an assertion or an illegal address: almost always an index out of range "
        "(a class label >= num_classes or negative in a loss, a token id >= num_embeddings in an embedding)."
    )
    if kernel:
        facts += f" The failing kernel: `{kernel}`."
    if where:
        facts += f" Reported at {where}, but CUDA errors surface asynchronously, often lines later."
    return Advice(
        facts,
        [
            advice.fix("debugging", "check-index-ranges", location=case.location),
            advice.fix("debugging", "cuda-launch-blocking", script=case.script),
            advice.fix("debugging", "reproduce-on-cpu"),
        ],
        ["After a device-side assert the CUDA context is unusable: restart the process before retrying."],
    )


@SPECIALIST.handles("dtype-mismatch")
def dtype_mismatch(case: Case) -> Advice:
    expected = case.text("expected_dtype", "param_dtype", "dtype_b")
    found = case.text("found_dtype", "input_dtype", "dtype_a")
    op_dtype, op = case.text("dtype"), case.text("op")
    facts = "Tensors of different dtypes meet in one operation"
    if expected and found:
        facts += f" ({expected} expected, {found} found)"
    elif op and op_dtype:
        facts = f"`{op}` has no kernel for {op_dtype}"
    where = case.at()
    if where:
        facts += f" at {where}"
    facts += "."
    if "double" in f"{expected or ''} {found or ''}".lower():
        facts += " float64 usually comes from numpy arrays converted with torch.from_numpy / torch.tensor."
    return Advice(
        facts,
        [
            advice.fix("debugging", "convert-inputs-once", location=case.location),
        ],
        ["Print `x.dtype, next(model.parameters()).dtype` right before the failing line."],
    )


@SPECIALIST.handles("device-mismatch")
def device_mismatch(case: Case) -> Advice:
    where = case.at()
    facts = "Tensors on different devices meet in one operation"
    facts += f" at {where}" if where else ""
    facts += ": something was left on the CPU (an input, a tensor attribute of a module, a new tensor made in forward)."
    return Advice(
        facts,
        [
            advice.fix("debugging", "print-devices", location=case.location),
            advice.fix("debugging", "new-tensors-on-input-device"),
        ],
        [f"`{case.check_cmd('TD2')}` flags tensor attributes that should be registered buffers."],
    )


@SPECIALIST.handles("index-out-of-range")
def index_out_of_range(case: Case) -> Advice:
    target = case.num("target")
    kernel = case.text("kernel")
    where = case.at()
    facts = "An index is outside its valid range"
    if target is not None:
        facts = f"Target {target:.0f} is out of bounds for the loss"
    elif kernel:
        facts += f" (the `{kernel}` kernel asserted)"
    if where:
        facts += f" at {where}"
    facts += ": a class label >= num_classes (or negative), or a token id >= num_embeddings."
    return Advice(
        facts,
        [
            advice.fix("debugging", "check-index-ranges-on-cpu", location=case.location),
            advice.fix("debugging", "cuda-launch-blocking-on-gpu", script=case.script),
        ],
        ["Run one step on CPU: CPU kernels raise 'index out of range' / 'Target N is out of bounds' with the value."],
    )


@SPECIALIST.handles("non-scalar-backward")
def non_scalar_backward(case: Case) -> Advice:
    where = case.at()
    facts = "backward() was called on a tensor with more than one element"
    facts += f" at {where}" if where else ""
    facts += ": the loss was not reduced to a scalar (a loss with reduction='none', or a per-sample output)."
    return Advice(
        facts,
        [
            advice.fix("debugging", "scalar-loss", location=case.location),
        ],
        [f"`{case.check_cmd('TD6')}` checks the training step; print `loss.shape` right before backward()."],
    )


@SPECIALIST.handles("zero-dim-index")
def zero_dim_index(case: Case) -> Advice:
    where = case.at("The script")
    name = case.text("variable") or "loss"
    return Advice(
        f"{where} indexes `{name}`, a 0-dim tensor, as code written before PyTorch 0.4 did: today it raises "
        "'IndexError: invalid index of a 0-dim tensor', usually at the first logging step.",
        [
            advice.fix("debugging", "item-for-values", location=case.location, name=name)
        ],
        [f"`{case.check_cmd('TD6')}` finds the other pre-0.4 idioms in the script."],
    )


@SPECIALIST.handles("deprecated-api")
def deprecated_api(case: Case) -> Advice:
    name = case.text("name", "variable")
    new = case.text("replacement")
    state = case.text("state") or "is deprecated"
    warning = case.text("warning")
    where = case.at("The script")
    used = f"`{name}`" if name else "a torch name"
    said = f' (torch says: "{warning}")' if warning else ""
    removed = "removed" in state
    if name and new:  # torch's message names the replacement
        fix = advice.fix("debugging", "replace-deprecated-name", location=case.location, name=name, new=new)
    else:
        fix = advice.fix("debugging", "follow-deprecation-warning", location=case.location)
    return Advice(
        f"{where} uses {used}, which {state}{said}."
        + (" The call fails at run time." if removed else " It still works, with a warning, until a torch "
           "release removes it."),
        [fix],
        [f"`{case.check_cmd('TD608')}` lists every deprecated torch name the script uses."],
    )


@SPECIALIST.handles("compile-failed")
def compile_failed(case: Case) -> Advice:
    # The profiling specialist owns the fix (bisect by backend, compile the part that compiles); from the
    # debugging side the step is a small reproduction to report or to work on.
    error = case.text("error")
    facts = "torch.compile failed" + (f": {error.rstrip('.')}" if error else "")
    facts += ". Once the failing stage is known, let the minifier cut the model down to the ops that fail."
    return Advice(
        facts,
        [
            advice.fix("debugging", "compile-minifier", location=case.location, script=case.script)
        ],
        [f"`TORCHDYNAMO_VERBOSE=1 python {case.script}` prints the full internal traceback of the failure."],
    )
