"""Errors a traceback names in autograd and tensor code: in-place modification, a second backward, a
device-side assert, dtype, device and index errors, deprecated APIs, and the debugging side of a
torch.compile failure.
"""

from __future__ import annotations

from torchdoctor.model import Fix
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
            Fix(
                title="Replace the in-place op with its out-of-place form",
                snippet="x = x + residual          # not x += residual\n"
                "h = torch.relu(h)         # not h.relu_() or nn.ReLU(inplace=True)\n"
                "y = x.clone(); y[mask] = 0   # clone before writing into a saved tensor",
                why="Backward needs the saved value; an in-place write bumps the tensor's version counter and autograd "
                "refuses to use the changed value.",
                verify="backward() runs without the 'modified by an inplace operation' error.",
                location=case.location,
            ),
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
            Fix(
                title="Cut tensors carried across steps from the previous graph",
                snippet="hidden = hidden.detach()   # at the start of each step",
                why="The carried tensor links this step's graph to last step's, whose buffers were freed after its backward.",
                verify="The error is gone and memory per step stays flat.",
                location=case.location,
            ),
            Fix(
                title="Sum the losses and call backward once",
                snippet="loss = loss_a + loss_b\nloss.backward()",
                why="Two backward calls over a shared graph need retain_graph=True on the first; one call over the sum "
                "gives the same gradients and frees the graph once.",
                verify="A single backward per step; the gradients match the two-call version.",
            ),
            Fix(
                title="retain_graph=True only when two backward passes are really needed",
                snippet="loss_a.backward(retain_graph=True)\nloss_b.backward()",
                why="Keeping the graph keeps all its activations alive until the last backward.",
                verify="Memory per step does not grow.",
                applies_when="Only for genuinely separate backward passes (e.g. a gradient penalty); never as a blanket fix.",
            ),
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
            Fix(
                title="Check label and index ranges before they reach the GPU",
                snippet=(
                    "assert 0 <= y.min() and y.max() < num_classes, (y.min().item(), y.max().item())\n"
                    "assert tokens.max() < model.embed.num_embeddings"
                ),
                why="CrossEntropyLoss and nn.Embedding index memory with these values; out-of-range values trip "
                "the kernel's bounds assertion.",
                verify="The assertion passes for a full epoch of the loader.",
                location=case.location,
            ),
            Fix(
                title="Get the real failing line: synchronous kernel launches",
                snippet=f"CUDA_LAUNCH_BLOCKING=1 python {case.script}",
                why="Kernels run asynchronously; with blocking launches the Python traceback points at the op that failed.",
                verify="The traceback now ends at the offending op.",
                applies_when="For debugging only: it makes every launch synchronous and slow.",
            ),
            Fix(
                title="Reproduce on CPU for a readable error",
                snippet="model.cpu(); loss = criterion(model(x.cpu()), y.cpu())",
                why="CPU kernels raise an IndexError with the bad value instead of a device-side assert.",
                verify="The CPU run raises a clear 'index out of range' or 'Target N is out of bounds' message.",
            ),
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
            Fix(
                title="Convert inputs once, where they enter",
                snippet="x = torch.from_numpy(array).float()      # numpy defaults to float64\n"
                "y = torch.as_tensor(labels, dtype=torch.long)  # class indices for cross_entropy",
                why="Model parameters are float32; class-index targets must be int64 (long).",
                verify="x.dtype == next(model.parameters()).dtype right before the forward.",
                location=case.location,
            ),
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
            Fix(
                title="Print the devices right before the failing op",
                snippet="print({n: b.device for n, b in model.named_buffers()}, x.device, next(model.parameters()).device)",
                why="Plain tensor attributes are not moved by model.to(device); only parameters and buffers are.",
                verify="Every tensor in the op is on the same device.",
                location=case.location,
            ),
            Fix(
                title="Create new tensors on the input's device",
                snippet="mask = torch.ones(n, device=x.device)\npos = torch.arange(t, device=x.device)",
                why="torch.ones/arange without device= allocate on the CPU.",
                verify="The forward runs on GPU without a device error.",
            ),
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
            Fix(
                title="Check label and index ranges on the CPU, before the forward",
                snippet=(
                    "assert 0 <= y.min() and y.max() < num_classes, (y.min().item(), y.max().item())\n"
                    "assert 0 <= tokens.min() and tokens.max() < model.embed.num_embeddings"
                ),
                why="The ranges a loss and an embedding accept are fixed when the layer is built; the data must fit them.",
                verify="The assertions hold for a full pass over the loader.",
                location=case.location,
            ),
            Fix(
                title="Get the real failing line on GPU: synchronous kernel launches",
                snippet=f"CUDA_LAUNCH_BLOCKING=1 python {case.script}",
                why="On CUDA the assert surfaces asynchronously, often lines later; blocking launches pin it to the op.",
                verify="The traceback ends at the embedding or loss call.",
                applies_when="CUDA runs, for debugging only.",
            ),
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
            Fix(
                title="Reduce the loss to a scalar before backward",
                snippet="loss = criterion(out, y)          # with reduction='none': shape (batch,)\n"
                "loss = (loss * weights).mean()     # weight per sample, then reduce\nloss.backward()",
                why="backward() without arguments needs a single number to start the chain rule from.",
                verify="loss.dim() == 0 before backward().",
                location=case.location,
            ),
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
            Fix(
                title="Read the value with .item()",
                snippet=f"print('loss', {name}.item())",
                why="Reductions return 0-dim tensors since 0.4; .item() returns the Python number.",
                verify="The logging line runs; the printed value matches the loss.",
                location=case.location,
            )
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
    return Advice(
        f"{where} uses {used}, which {state}{said}."
        + (" The call fails at run time." if removed else " It still works, with a warning, until a torch "
           "release removes it."),
        [
            Fix(
                title=f"Replace `{name}` with `{new}`" if name and new else "Move to the API torch's warning names",
                why="The deprecated path is kept only for compatibility: it warns on use, gets no fixes and "
                "disappears in a later release, so the script breaks on a torch upgrade.",
                verify="`python -W error::DeprecationWarning -W error::FutureWarning` runs the script without a "
                "deprecation error, and `torchdoctor check --select TD608` reports nothing.",
                location=case.location,
            )
        ],
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
            Fix(
                title="Let the minifier write a minimal reproduction",
                snippet=f"TORCHDYNAMO_REPRO_AFTER=aot python {case.script}   # or =dynamo if tracing itself fails",
                why="On a compile failure torch._dynamo writes minifier_launcher.py; running it shrinks the graph to "
                "the few ops that still fail, which is what a bug report or a workaround needs.",
                verify="`python minifier_launcher.py` fails with the same error on a graph of a few ops.",
                location=case.location,
            )
        ],
        [f"`TORCHDYNAMO_VERBOSE=1 python {case.script}` prints the full internal traceback of the failure."],
    )
