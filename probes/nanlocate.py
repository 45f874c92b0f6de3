"""Find the first non-finite value of a step by replaying that step's forward (and backward).

The nan probe's sentinel only says *that* a loss or a gradient went
non-finite. When it fires, this module replays the same step once, with
what was kept from the real step at little cost: the top-level modules'
inputs (references, not copies) and, for models with dropout, the RNG state
before their forward (so dropout draws the same masks). The parameters have
not changed yet: the sentinel fires before `optimizer.step()`.

Forward replay: forward pre/post hooks on every submodule record, in the
order modules finish, whether their inputs, own parameters and outputs are
finite; a `TorchFunctionMode` checks every torch call the same way and
remembers the user's line of the first op that turns finite inputs into a
non-finite output (`torch.log` of a zero). The first bad module is the first
module, in execution order, whose output is non-finite while its inputs and
own parameters are finite.

Backward replay: the same forward, then `torch.autograd.grad` from the
outputs (seeded with ones: keeping the real loss's gradient would cost a
hook and memory every step, and a derivative that is infinite or 0/0 at a
point stays so whatever finite gradient multiplies it) to the parameters —
never touching `.grad` — with a hook on every autograd node created by the
replay. The first node, in backward execution order,
that turns finite incoming gradients into non-finite ones is the culprit; the
forward replay already knows which module and line created it. A replayed
call's input that carries the real step's graph (a loss module's prediction)
is cut into a leaf that requires grad, and gradients are asked of those leaves
too: the real graph was freed by the step's own backward, and the loss's ops
must run backward even though they reach no parameter. The script's loss
functions are replayed with grad as well, on copies: a square root of an exact
zero is finite forward and infinite backward.

A batch that reaches the model already non-finite is not the model's doing: when the DataLoader gave it from a
map-style dataset, the items of that batch are fetched again (`dataset[i]`, in this process) under the same op
check, and the first op of the script's dataset code that turned finite values non-finite names the line (a
0/0 in a transform); code that makes its values outside torch (NumPy) is not seen, and the loader's line stays.

Side effects are contained: the RNG state is forked and restored, buffers
(BatchNorm running statistics) are replaced by copies for the replay and put
back untouched (their version counters too: the real step's graph saved
them), and the forward
replay runs under no_grad. Compiled and DDP-wrapped models are replayed
through their inner module, eagerly.

Cost: roughly 2-4× one forward for a forward replay and 3-6× one step for a
backward replay (a finiteness check per module and per op), paid once per
run, only after something went wrong (bench/bench_run.py measures it next
to anomaly mode).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import weakref
from dataclasses import dataclass
from typing import Any

from torchdoctor.probes.forwards import unwatched
from torchdoctor.probes.models import ModelMap, unwrap
from torchdoctor.probes.userframes import is_library_file

MAX_TENSORS = 64  # inputs/outputs looked at per call
MAX_BUILT = 4096  # torch layers whose construction line is remembered
# torch layer -> (path, line, function) of the user's code that built it (filled by the nan probe)
BUILT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@dataclass
class Call:
    """One call of a top-level module, kept so the step can be replayed."""

    module: Any  # as the script called it (maybe a compiled or DDP wrapper)
    args: tuple
    kwargs: dict
    cpu_rng: Any = None
    cuda_rng: Any = None
    # (device type, dtype) of each autocast region the call ran in: a float16 overflow happens only there
    autocast: tuple[tuple[str, Any], ...] = ()
    # a module without parameters called on the model's outputs (a loss module): its inputs come from the
    # step itself, so they are replayed through it but never blamed as the batch
    parameterless: bool = False
    order: int = 0  # when it was called in the step: replays run in the script's order
    # the script's own loss function (probes/lossfuncs.py) this call ran instead of a module: replayed on
    # copies of its arguments, forward only
    function: Any = None


def autocast_state(torch: Any) -> tuple[tuple[str, Any], ...]:
    """The autocast regions in force right now, as (device type, dtype) pairs."""
    found = []
    for device in ("cpu", "cuda"):
        try:
            if torch.is_autocast_enabled(device):
                found.append((device, torch.get_autocast_dtype(device)))
        except (AttributeError, RuntimeError, TypeError):  # an older torch without the per-device queries
            continue
    return tuple(found)


def tensors_in(obj: Any, torch: Any, path: str = "", limit: int = MAX_TENSORS) -> list[tuple[str, Any]]:
    """(field, tensor) pairs inside nested tuples, lists, dicts and dataclass-like outputs."""
    out: list[tuple[str, Any]] = []

    def walk(value: Any, where: str, depth: int) -> None:
        if len(out) >= limit or depth > 4:
            return
        if isinstance(value, torch.Tensor):
            out.append((where, value))
        elif isinstance(value, dict):
            for key, item in list(value.items())[:limit]:
                walk(item, f"{where}[{key!r}]", depth + 1)
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value[:limit]):
                walk(item, f"{where}[{i}]", depth + 1)

    walk(obj, path, 0)
    return out


def is_float(t: Any) -> bool:
    return t.is_floating_point() or t.is_complex()


def finite(t: Any) -> bool:
    if not is_float(t) or t.numel() == 0:
        return True
    return bool(t.isfinite().all())


def all_finite(obj: Any, torch: Any) -> bool:
    return all(finite(t) for _, t in tensors_in(obj, torch))


def nonfinite_count(t: Any) -> int:
    return int((~t.isfinite()).sum()) if is_float(t) else 0


_PREFIXES = (
    ("torch._C._nn", "F."),
    ("torch.nn.functional", "F."),
    ("torch._C._VariableFunctions", "torch."),
    ("torch._C._linalg", "torch.linalg."),
    ("torch._C._special", "torch.special."),
    ("torch._C._fft", "torch.fft."),
    ("torch", "torch."),
)


def op_name(func: Any) -> str:
    qual = getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or repr(func)
    if qual.startswith("_VariableFunctionsClass."):
        return "torch." + qual.split(".", 1)[1]
    if qual.startswith(("TensorBase.", "_TensorBase.", "Tensor.")):
        return "Tensor." + qual.split(".", 1)[1]
    module = getattr(func, "__module__", None) or ""
    for prefix, shown in _PREFIXES:
        if module == prefix or module.startswith(prefix + "."):
            return shown + qual
    return f"{module}.{qual}" if module else qual


class Recorder:
    """Module and op records of one replayed forward."""

    def __init__(self, torch: Any, names: ModelMap) -> None:
        self.torch = torch
        self.names = names
        self.stack: list[str] = []
        self.pending: list[dict[str, Any]] = []
        self.finished: list[dict[str, Any]] = []  # modules in the order they finished
        self.first_op: dict[str, Any] | None = None
        self.nodes: dict[int, tuple[Any, dict[str, Any]]] = {}  # id(autograd node) -> (node, what made it)
        self.map_nodes = False

    def pre(self, module: Any, args: Any) -> None:
        label = self.names.label(module)
        with self.torch._C.DisableTorchFunction():  # our own checks are not the model's ops
            params_finite = all(finite(p) for p in module.parameters(recurse=False))
            inputs_finite = all_finite(args, self.torch)
        try:
            built = BUILT.get(module)
        except TypeError:
            built = None
        self.pending.append({
            "module": label, "module_type": type(module).__name__,
            "inputs_finite": inputs_finite, "params_finite": params_finite, "built": built,
        })
        self.stack.append(label)

    def post(self, module: Any, args: Any, output: Any) -> None:
        if not self.pending:
            return
        entry = self.pending.pop()
        if self.stack:
            self.stack.pop()
        with self.torch._C.DisableTorchFunction():
            entry["output_finite"] = all_finite(output, self.torch)
        self.finished.append(entry)

    def op(self, func: Any, args: Any, kwargs: Any, out: Any) -> None:
        outs = tensors_in(out, self.torch, limit=8)
        if not outs:
            return
        info: dict[str, Any] | None = None
        if self.first_op is None and not all(finite(t) for _, t in outs):
            if all_finite(args, self.torch) and all_finite(kwargs, self.torch):
                info = self._describe(func)
                self.first_op = info
        if self.map_nodes:
            for _, t in outs:
                node = getattr(t, "grad_fn", None)
                if node is not None and id(node) not in self.nodes:
                    self._map(node, info or self._describe(func))

    def _describe(self, func: Any) -> dict[str, Any]:
        site = _replayed_site(sys._getframe(1))
        info: dict[str, Any] = {"op": op_name(func), "module": self.stack[-1] if self.stack else None}
        if site is not None:
            info.update(path=site[0], line=site[1], function=site[2])
            if site[3]:
                info["via_container"] = True
        return info

    def _map(self, node: Any, info: dict[str, Any]) -> None:
        """Attribute `node` and the nodes it created on the way (not yet mapped) to one op."""
        todo = [node]
        while todo:
            current = todo.pop()
            if current is None or id(current) in self.nodes or type(current).__name__ == "AccumulateGrad":
                continue
            self.nodes[id(current)] = (current, info)
            todo.extend(n for n, _ in getattr(current, "next_functions", ()))


_CONTAINER_CODE = f"{os.sep}torch{os.sep}nn{os.sep}modules{os.sep}container.py"


def _replayed_site(frame: Any) -> tuple[str, int, str, bool] | None:
    """The user's line of a replayed op, and whether a torch container (nn.Sequential) ran it: the user's line
    then only called the container, and says nothing of which layer; None when only library code sits between
    the op and the replay."""
    via_container = False
    while frame is not None:
        if frame.f_code in _REPLAY_CODES:
            return None
        filename = frame.f_code.co_filename
        if not is_library_file(filename):
            return filename, frame.f_lineno, frame.f_code.co_name, via_container
        via_container = via_container or filename.endswith(_CONTAINER_CODE)
        frame = frame.f_back
    return None


def _ops_mode(torch: Any, recorder: Recorder) -> Any:
    from torch.overrides import TorchFunctionMode

    class RecordOps(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            if getattr(func, "__name__", "") != "__get__":
                recorder.op(func, args, kwargs, out)
            return out

    return RecordOps()


class Replay:
    """One replay of the recorded calls, restoring RNG and buffers afterwards."""

    def __init__(self, torch: Any, calls: list[Call], names: ModelMap) -> None:
        self.torch = torch
        self.calls = calls
        self.names = names
        # the leaves that stand for inputs of replayed calls (a loss's prediction): gradients are asked of them
        # too, or the backward would skip every op between a loss and its inputs
        self.leaves: list[Any] = []

    def _devices(self) -> list[int]:
        cuda = self.torch.cuda
        if cuda.is_available() and cuda.is_initialized():
            return list(range(cuda.device_count()))
        return []

    def run(self, recorder: Recorder, with_grad: bool) -> list[tuple[Call, Any]]:
        torch = self.torch
        outputs: list[tuple[Call, Any]] = []
        devices = self._devices()
        with torch.random.fork_rng(devices=devices):
            for call in self.calls:
                if call.function is not None:
                    out = self._run_function(call, recorder, with_grad)
                    if with_grad and out is not None:
                        outputs.append((call, out))
                    if recorder.first_op is not None and not with_grad:
                        break
                    continue
                inner = unwrap(call.module)
                # The replay runs on copies of the buffers, swapped in: writing into the real ones (a batch norm's
                # running statistics) would bump their version counters, and the real step's backward, which
                # saved them, would then fail with "modified by an inplace operation".
                swapped = _swap_buffers(inner)
                handles = []
                for module in inner.modules():
                    handles.append(module.register_forward_pre_hook(recorder.pre))
                    handles.append(module.register_forward_hook(recorder.post))
                try:
                    if call.cpu_rng is not None:
                        torch.set_rng_state(call.cpu_rng)
                    if call.cuda_rng is not None and devices:
                        torch.cuda.set_rng_state_all(call.cuda_rng)
                    grad = torch.enable_grad() if with_grad else torch.no_grad()
                    with grad, unwatched(), contextlib.ExitStack() as regions:
                        for device, dtype in call.autocast:  # the regions the real call ran in
                            regions.enter_context(torch.autocast(device, dtype=dtype))
                        # With grad, an input that carries the real step's graph (a loss module's prediction) is
                        # cut from it: that graph was freed by the step's own backward, and the replay's backward
                        # needs only the call's own ops.
                        args, kwargs = (_leafed(call.args, torch, self.leaves), _leafed(call.kwargs, torch,
                                        self.leaves)) if with_grad else (call.args, call.kwargs)
                        with _ops_mode(torch, recorder):
                            out = inner(*args, **kwargs)
                    outputs.append((call, out))
                finally:
                    for h in handles:
                        h.remove()
                    for module, name, buffer in swapped:
                        module._buffers[name] = buffer
                if recorder.first_op is not None and not with_grad:
                    break
        return outputs


    def _run_function(self, call: Call, recorder: Recorder, with_grad: bool = False) -> Any:
        """A loss function's call again, on copies of its tensors (it may write into them), under the op check;
        with grad, the copies of its inputs that required grad are leaves that do, and its output is returned so
        that the backward replay runs through the function's own ops (a square root of an exact zero is finite
        forward and infinite backward)."""
        torch = self.torch
        if not _plain(call.args, torch) or not _plain(call.kwargs, torch):
            return None  # a module, an optimizer or another object it could change for good: not replayed
        if not any(t.requires_grad for _, t in tensors_in((call.args, call.kwargs), torch)):
            return None  # no prediction among its inputs: a data helper (`get_batch('train')`), maybe one that
            # advances an iterator, not a loss
        leaves = self.leaves if with_grad else None
        args, kwargs = _copied(call.args, torch, leaves), _copied(call.kwargs, torch, leaves)
        grad = torch.enable_grad() if with_grad else torch.no_grad()
        with grad, unwatched(), contextlib.ExitStack() as regions:
            for device, dtype in call.autocast:
                regions.enter_context(torch.autocast(device, dtype=dtype))
            with _ops_mode(torch, recorder), contextlib.redirect_stdout(None):
                return call.function(*args, **kwargs)


def _swap_buffers(model: Any) -> list[tuple[Any, str, Any]]:
    """Put a copy in place of each buffer of `model`'s modules; returns what to put back."""
    swapped = []
    for module in model.modules():
        for name, buffer in list(module._buffers.items()):
            if buffer is not None:
                module._buffers[name] = buffer.detach().clone()
                swapped.append((module, name, buffer))
    return swapped


def _plain(value: Any, torch: Any, depth: int = 0) -> bool:
    """Tensors, numbers, strings and None, in tuples, lists and dicts: what a copy fully separates from the script."""
    if value is None or isinstance(value, (torch.Tensor, bool, int, float, complex, str, bytes)):
        return True
    if depth > 4 or type(value) not in (list, tuple, dict):
        return False
    items = value.values() if isinstance(value, dict) else value
    return all(_plain(v, torch, depth + 1) for v in items)


def _copied(value: Any, torch: Any, leaves: list[Any] | None = None, depth: int = 0) -> Any:
    """A copy of `value`'s tensors; given `leaves`, a copy of one that required grad is a leaf that does, added
    to `leaves`."""
    if isinstance(value, torch.Tensor):
        copy = value.detach().clone()
        if leaves is not None and value.requires_grad and copy.is_floating_point():
            leaves.append(copy.requires_grad_(True))
        return copy
    if depth > 4:
        return value
    if isinstance(value, dict):
        return {k: _copied(v, torch, leaves, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        return type(value)(_copied(v, torch, leaves, depth + 1) for v in value)
    return value


def _leafed(value: Any, torch: Any, leaves: list[Any], depth: int = 0) -> Any:
    """`value` with each float tensor that carries a graph replaced by a detached leaf that requires grad (the same
    storage, no copy; added to `leaves`); other tensors and objects as they are."""
    if isinstance(value, torch.Tensor):
        if value.grad_fn is not None and value.is_floating_point():
            leaf = value.detach().requires_grad_(True)
            leaves.append(leaf)
            return leaf
        return value
    if depth > 4:
        return value
    if isinstance(value, dict) and type(value) is dict:
        return {k: _leafed(v, torch, leaves, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        return type(value)(_leafed(v, torch, leaves, depth + 1) for v in value)
    return value


_REPLAY_CODE = Replay.run.__code__
_FUNCTION_REPLAY_CODE = Replay._run_function.__code__


def check_inputs(torch: Any, calls: list[Call], names: ModelMap) -> dict[str, Any] | None:
    """The first non-finite float input of a top-level module, if any."""
    for call in calls:
        if call.parameterless:
            continue  # its inputs are the model's outputs: the replay decides
        for where, t in tensors_in(call.args, torch, "args") + tensors_in(call.kwargs, torch, "kwargs"):
            if not finite(t):
                return {
                    "phase": "input",
                    "module": names.label(call.module),
                    "field": where,
                    "nonfinite_count": nonfinite_count(t),
                    "numel": t.numel(),
                    "shape": list(t.shape),
                }
    return None


MAX_ITEMS = 64  # dataset items fetched again to find the op that made a non-finite batch


def locate_in_dataset(torch: Any, dataset: Any, indices: Any, budget_s: float = 5.0) -> dict[str, Any] | None:
    """The op and user line that made a non-finite value while the dataset built the items of one batch.

    The items are fetched again in this process, with every torch call checked; the RNG states are restored
    after (a random augmentation draws other values than in the real fetch: a value made non-finite only by
    some draws may not show again). None when no op was seen making one.
    """
    from torch.utils.data import IterableDataset

    if dataset is None or isinstance(dataset, IterableDataset) or not hasattr(dataset, "__getitem__"):
        return None
    items = indices if isinstance(indices, (list, tuple)) else [indices]
    items = [i for i in items[:MAX_ITEMS] if isinstance(i, int)]
    if not items:
        return None
    recorder = Recorder(torch, None)  # type: ignore[arg-type]  # no modules are hooked: names is never read
    started = time.perf_counter()
    with _states_kept(torch), unwatched(), _ops_mode(torch, recorder):
        for position, index in enumerate(items):
            try:
                dataset[index]
            except Exception:  # noqa: BLE001 - a dataset that cannot be fetched again here: nothing learnt
                return None
            if recorder.first_op is not None:
                return {**recorder.first_op, "item": index, "item_position": position}
            if time.perf_counter() - started > budget_s:
                break
    return None


@contextlib.contextmanager
def _states_kept(torch: Any) -> Any:
    """Python's, NumPy's (when imported) and torch's CPU random states, restored on the way out."""
    import random

    numpy = sys.modules.get("numpy")
    py_state = random.getstate()
    np_state = numpy.random.get_state() if numpy is not None else None
    with torch.random.fork_rng(devices=[]):
        try:
            yield
        finally:
            random.setstate(py_state)
            if numpy is not None:
                numpy.random.set_state(np_state)


_REPLAY_CODES = (_REPLAY_CODE, _FUNCTION_REPLAY_CODE, locate_in_dataset.__code__)  # above them: not the op's caller


def check_parameters(names: ModelMap) -> dict[str, Any] | None:
    """The first layer (execution order) holding a non-finite parameter."""
    for layer in names.layers:
        for plabel, p in layer.params:
            if not finite(p.detach()):
                return {"phase": "parameters", "module": layer.label, "module_type": layer.module_type,
                        "parameter": plabel, "nonfinite_count": nonfinite_count(p.detach()), "numel": p.numel()}
    return None


def first_bad_module(recorder: Recorder) -> dict[str, Any] | None:
    for entry in recorder.finished:
        if not entry["output_finite"] and entry["inputs_finite"] and entry["params_finite"]:
            return entry
    return None


def locate_forward(torch: Any, calls: list[Call], names: ModelMap) -> dict[str, Any]:
    """Why a loss was non-finite: the batch, the parameters, a module, or code after the model."""
    started = time.perf_counter()
    result = check_inputs(torch, calls, names) or check_parameters(names)
    if result is None:
        recorder = Recorder(torch, names)
        Replay(torch, calls, names).run(recorder, with_grad=False)
        result = _forward_result(recorder)
    result["cost_ms"] = round((time.perf_counter() - started) * 1e3, 3)
    return result


def _forward_result(recorder: Recorder) -> dict[str, Any]:
    bad = first_bad_module(recorder)
    op = recorder.first_op
    if bad is None and op is None:
        return {"phase": "forward", "module": None, "outside_model": True}
    result: dict[str, Any] = {"phase": "forward"}
    if bad is not None:
        result.update(module=bad["module"], module_type=bad["module_type"])
    if op is not None:
        result["op"] = op["op"]
        same = bad is None or op.get("module") == bad["module"] or (op.get("module") or "").startswith(bad["module"] + ".")
        # an op that a torch layer inside a container ran is better named where that layer was built than at the
        # script's line that called the container (a user forward calling `self.body(x)`)
        if same and not (op.get("via_container") and bad is not None and bad.get("built")):
            result.update({k: op[k] for k in ("path", "line", "function") if k in op})
        if bad is None:
            result["module"] = op.get("module")
    if "line" not in result and bad is not None and bad.get("built"):
        # a torch layer called by a library container (nn.Sequential): the line that built it
        result["path"], result["line"], result["function"] = bad["built"]
        result["built_here"] = True
    return result


def locate_backward(torch: Any, calls: list[Call], names: ModelMap) -> dict[str, Any]:
    """Which module first turns finite gradients into non-finite ones (loss finite, gradients not)."""
    started = time.perf_counter()
    result = check_inputs(torch, calls, names) or check_parameters(names)
    if result is None:
        result = _backward(torch, calls, names)
    result["cost_ms"] = round((time.perf_counter() - started) * 1e3, 3)
    return result


def _backward(torch: Any, calls: list[Call], names: ModelMap) -> dict[str, Any]:
    recorder = Recorder(torch, names)
    recorder.map_nodes = True
    replay = Replay(torch, calls, names)
    outputs = replay.run(recorder, with_grad=True)
    forward = _forward_result(recorder)
    if forward.get("module") is not None or forward.get("op"):
        return forward  # the replay's forward already goes non-finite: report where
    roots: list[Any] = []
    grads: list[Any] = []
    for _, out in outputs:
        for _, t in tensors_in(out, torch):
            if t.requires_grad and t.grad_fn is not None and is_float(t):
                roots.append(t)
                grads.append(torch.ones_like(t))
    params = [p for layer in names.layers for _, p in layer.params if p.requires_grad]
    targets = params + replay.leaves
    if not roots or not params:
        return {"phase": "backward", "module": None, "reproduced": False,
                "note": "the replayed forward produced no output that requires grad"}
    fired: list[tuple[int, bool, bool]] = []
    handles = []

    def hook_for(node_id: int) -> Any:
        def hook(grad_inputs: Any, grad_outputs: Any) -> None:
            incoming = all(g is None or finite(g) for g in grad_outputs)
            outgoing = all(g is None or finite(g) for g in grad_inputs)
            fired.append((node_id, incoming, outgoing))
        return hook

    for node_id, (node, _) in recorder.nodes.items():
        try:
            handles.append(node.register_hook(hook_for(node_id)))
        except (RuntimeError, AttributeError):
            continue
    try:
        replayed = torch.autograd.grad(roots, targets, grad_outputs=grads, allow_unused=True)[: len(params)]
    finally:
        for h in handles:
            h.remove()
    bad_params = [(names.params.get(id(p), "?"), names.owner.get(id(p))) for p, g in zip(params, replayed, strict=True)
                  if g is not None and not finite(g)]
    culprit = next((recorder.nodes[i][1] for i, inc, outg in fired if inc and not outg), None)
    if culprit is None:
        return {"phase": "backward", "module": None, "reproduced": bool(bad_params),
                "parameter": bad_params[-1][0] if bad_params else None}
    module = culprit.get("module")
    own = [p for p, owner in bad_params if owner == module]
    result = {"phase": "backward", "module": module, "op": culprit.get("op"), "reproduced": True,
              "parameter": own[0] if own else (bad_params[-1][0] if bad_params else None)}
    entry = next((e for e in recorder.finished if e["module"] == module), None)
    result["module_type"] = entry["module_type"] if entry else None
    if culprit.get("via_container") and entry and entry.get("built"):
        result["path"], result["line"], result["function"] = entry["built"]
        result["built_here"] = True
    else:
        result.update({k: culprit[k] for k in ("path", "line", "function") if k in culprit})
    return result
