"""The nan probe: a cheap finiteness sentinel every step, and on the first non-finite value, where it came from.

Measures
--------
- the loss: the tensor `backward()` is called on (`torch.autograd.backward`
  is wrapped; `Tensor.backward` calls it), checked before the pass runs — on
  CPU one `item()`, on CUDA a device-side flag copied to pinned memory and
  read one step later, so the sentinel never stalls the GPU queue;
- the gradients: at the optimizer step pre-hook, the norm of every gradient
  (`torch.linalg.vector_norm` each for up to 32 CPU tensors; else
  `torch._foreach_norm`, stacked and read as one transfer): the total norm
  (finite ⇔ every gradient is finite) and the norm of each layer (a
  module that owns parameters, in execution order). Every step, unless the
  check alone costs more than `budget_fraction` of the step (a small model
  on a CPU, whose steps take a few ms): then every k-th step after the
  first `dense_steps`, and a non-finite gradient on an unchecked step turns
  the next loss non-finite, which the sentinel catches there (the report
  then says which update wrote non-finite parameters, without the backward
  op). On a GPU the check is a few kernel launches; on a CPU it is one
  memory-bound pass over the gradients (~70-110 µs for 0.4 M parameters);
- the parameters: the same norm check every `param_check_every` steps;
- a `GradScaler`, when the script uses one (its `scale`, `step` and `update`
  are wrapped): the scale after each update and the steps it skipped. An
  inf/NaN gradient on a step the scaler skips is its normal overflow
  handling, not a diagnosis; an unscaled loss that stays non-finite for
  `scaler_localise_after` steps is.
- the top-level modules' inputs (references, no copies) and, when the model
  has dropout, the CPU/CUDA RNG state before each forward: one forward
  pre-hook on each top-level module (~5 µs; ~10 µs with the RNG state) —
  what a replay needs.

Localisation (probes/nanlocate.py), once per kind of failure, only after the
sentinel fired and before the optimizer applies anything: the input batch
and the parameters are checked, then the step's forward (for a non-finite
loss) or forward and backward (for non-finite gradients) is replayed with a
hook on every module and a check on every torch call, naming the first
module, op and user line that turned finite values non-finite. On CUDA the
sentinel is read one step late: the first non-finite step is reported at
once, and from then on the check is synchronous so the next occurrence is
localised. A loss the replay finds non-finite outside the model with no op to name
(a helper applied to the target) arms a watch of the next steps' ops
(probes/nanwatch.py) for the op that makes the next non-finite value.
The first step's forward runs before the models are known; it is
seen through global module hooks that are removed at the first backward (or
as soon as `torch.compile` is called, so compiled code never depends on
them). A model called inside code compiled as a function is not replayed
(hooking it would change dynamo's guards): its report names no module.

Costs (bench/bench_run.py, CPU, 1 thread; its own account is in the report,
`probe_us_per_step`)
-----------------------------------------------------------------------------
Measured inside a 3 ms CPU training step (the interpreter's and the kernel's
code are cold there: every figure is 5-10× its tight-loop cost): loss
sentinel ~13 µs per step (one `item()`); gradient norms ~70-110 µs per
checked step for 0.4 M parameters (a memory pass over the gradients; every
step unless over `budget_fraction` of it); module input capture ~5 µs per
forward. A localisation costs a few forward/backward passes, once.

Symptoms (thresholds in rules/data/thresholds.toml, [nan]; classified in
doctor/analysis/nan.py)
--------------------------------------------------------------------------
- nan-loss: the loss was NaN/Inf (no threshold: one occurrence), with the
  first bad module, op, line, phase and the learning rate;
- nonfinite-grad: the loss was finite but a gradient was not, with the module
  whose backward produced it and the first parameter hit;
- nonfinite-input: the batch that went into the model already held NaN/Inf
  (field, count, batch index in the epoch);
- exploding-gradients: the total gradient norm rose `exploding_growth`× above
  its median over the first `baseline_steps` sampled steps;
- vanishing-gradients: the first-to-last-layer gradient norm ratio stayed
  below `vanishing_ratio` (median over the sampled steps after
  `warmup_steps`);
- loss-scale-collapse: the scale fell below `collapse_scale`, or the scaler
  skipped `collapse_consecutive_skips` steps in a row after its first
  successful step, or more than `collapse_skipped_fraction` of the steps.
"""

from __future__ import annotations

import linecache
import math
import statistics
import sys
import time
import weakref
from array import array
from typing import Any

from torchdoctor.probes.base import Probe
from torchdoctor.probes.lossfuncs import LossFunctions
from torchdoctor.probes.models import ModelMap, is_compiled
from torchdoctor.probes.nangraph import culprit, singular_op
from torchdoctor.probes.nanlocate import (
    BUILT,
    MAX_BUILT,
    Call,
    autocast_state,
    finite,
    locate_backward,
    locate_forward,
    locate_in_dataset,
    nonfinite_count,
    tensors_in,
)
from torchdoctor.probes.nanwatch import OpWatch
from torchdoctor.probes.patches import backward_watch, compile_watch, data_watch, user_site
from torchdoctor.probes.transparent import transparent
from torchdoctor.probes.userframes import in_torchdoctor, is_library_file


def _number(x: float) -> float | str:
    """A float for JSON: 'nan', 'inf', '-inf' as strings."""
    if math.isfinite(x):
        return x
    return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")


def _sig(x: float, digits: int = 4) -> float | str:
    return _number(float(f"{x:.{digits}g}")) if math.isfinite(x) else _number(x)


# Up to this many CPU gradients, a norm per tensor beats foreach (CPU has no fused kernel): right after a
# backward, 0.4 M parameters in 6 tensors take ~70 µs either way, 67 k in 26 (a 2-layer transformer) ~85 µs
# per tensor against ~100 µs with foreach. (numpy's BLAS dot, twice as fast on warm data, is not faster there.)
PER_TENSOR_MAX = 32


class _Deferred:
    """Values of a device tensor read on the host later without stalling (CUDA), or now (CPU)."""

    def __init__(self, torch: Any, tensor: Any, step: int) -> None:
        self.step = step
        self.event = None
        if tensor.device.type == "cpu":
            self.host = tensor
            return
        self.host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        self.host.copy_(tensor, non_blocking=True)
        self.event = torch.cuda.Event()
        self.event.record()

    def values(self) -> list[float]:
        if self.event is not None:
            self.event.synchronize()
        return self.host.reshape(-1).tolist()


class NanProbe(Probe):
    name = "nan"

    def install(self) -> None:
        import torch

        self.torch = torch
        opt = self.options
        self.dense_steps = int(opt.get("dense_steps", 20))
        self.budget = float(opt.get("budget_fraction", 0.015))
        self.param_every = int(opt.get("param_check_every", 50))
        self.layer_every = int(opt.get("layer_norms_every", 25))
        self.keep_rng = True  # until the models are known: dropout needs the same masks in a replay
        self.scaler_after = int(opt.get("scaler_localise_after", 3))
        self.max_events = int(opt.get("max_events", 200))
        self.names: ModelMap | None = None
        self.params: list[Any] = []
        self.calls: dict[int, Call] = {}  # id(top-level module) -> its latest call
        self.call_gen: dict[int, int] = {}  # id(module) -> backward count when it was called
        self._root_handles: list[Any] = []
        self._global_handles: list[Any] = []
        self._first_seen = 0
        self._order = 0  # top-level calls so far: a replay runs them in the script's order
        self._loss_modules: set[int] = set()  # ids of the parameterless top-level modules whose calls are kept
        self.first_calls_limit = int(opt.get("first_calls_limit", 256))
        self._first_calls: dict[int, Call] = {}
        self._first_order: list[int] = []
        self._depth = 0
        self._optimizer: Any = None
        self.localised: set[str] = set()
        self.events_left = self.max_events
        self.sync = False  # CUDA: read the sentinel at once (after a first non-finite value)
        self._pending: list[tuple[str, _Deferred, Any]] = []
        self._loss: float | str | None = None
        self._grad_norm: float | str | None = None
        self._grad_norm_step = 0
        self._next_check = 1
        self._check_every = 0  # steps between gradient checks after the dense phase (0: not judged yet)
        self._last_t: float | None = None
        self._step_s = 0.0
        self._check_cost = array("d")
        self._costs = array("d")  # the probe's own seconds in each step
        self._spent = 0.0
        self.checked = 0
        self.nonfinite_seen = {"loss": 0, "grad": 0, "parameters": 0}
        # GradScaler
        self.scaler_seen = False
        self._scaled: tuple[int, Any] | None = None  # (id of the scaled loss, the loss before scaling)
        self._pre_calls = 0
        self._scaler_opt: Any = None
        self.scale: float | None = None
        self.skipped = 0
        self.skip_streak = 0
        self.max_skip_streak = 0
        self.stepped_once = False
        self.nonfinite_streak = 0

        # the script's own loss functions (probes/lossfuncs.py): found in one step's loss computation after
        # `loss_functions_step`, then their calls are kept for a replay like a top-level module's
        self.loss_functions = LossFunctions(torch, self._function_call)
        self.loss_functions_step = int(opt.get("loss_functions_step", 2))
        self.loss_functions_max_step_s = float(opt.get("loss_functions_max_step_s", 1.0))
        # a non-finite loss the replay placed nowhere in particular: the next steps' ops are watched for the op
        # that makes one (probes/nanwatch.py), armed at an optimizer step once a step time under a second is known
        self.op_watch = OpWatch(torch, self._nonfinite_op)
        self.op_watch_steps = int(opt.get("op_watch_steps", 8))
        self._op_watch_wanted = False
        self.backward = backward_watch(torch)
        self.backward.subscribe(self, self._before_backward)
        self.data = data_watch(torch)
        self.data.keep_last = True
        self._wrap_scaler()
        self._watch_layer_construction()
        self.compiles = compile_watch(torch)
        self.compiles.subscribe(self, self._drop_global_hooks)
        if not self._compiled_anything():
            mod = torch.nn.modules.module
            self._global_handles = [
                mod.register_module_forward_pre_hook(self._first_pre),
                mod.register_module_forward_hook(self._first_post, with_kwargs=True, always_call=True),
            ]

    # -- the first step: global hooks until the models are known ------------------------------

    def _first_pre(self, module: Any, args: Any) -> None:
        if self._depth == 0 and self.enabled:
            self._order += 1
            regions = autocast_state(self.torch) if self.torch._C._is_any_autocast_enabled() else ()
            self._first_calls[id(module)] = Call(module, (), {}, *self._rng(), autocast=regions, order=self._order)
            self._first_seen += 1
            if self._first_seen > self.first_calls_limit:  # no backward in sight (inference, data prep)
                self._drop_global_hooks()
        self._depth += 1

    def _first_post(self, module: Any, args: Any, kwargs: Any, output: Any) -> None:
        self._depth = max(self._depth - 1, 0)
        if self._depth == 0:
            call = self._first_calls.get(id(module))
            if call is not None and call.module is module:
                call.args, call.kwargs = args, dict(kwargs or {})
                self.call_gen[id(module)] = self.backward.calls
        if module._parameters:
            self._first_order.append(id(module))

    def _compiled_anything(self) -> bool:
        """torch.compile was called, or dynamo already holds compiled code."""
        if self.compiles.calls:
            return True
        dynamo = sys.modules.get("torch._dynamo.utils")
        try:
            return bool(dynamo and dynamo.counters["stats"]["unique_graphs"])
        except Exception:  # noqa: BLE001
            return True

    def _drop_global_hooks(self) -> None:
        for h in self._global_handles:
            h.remove()
        self._global_handles = []

    def _rng(self) -> tuple[Any, Any]:
        torch = self.torch
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        return torch.get_rng_state(), cuda

    # -- the models ---------------------------------------------------------------------------------

    def _discover(self, params: list[Any]) -> None:
        self._drop_global_hooks()
        frame = sys._getframe(1)
        self.names = ModelMap.build(self.torch, params, frame, order=self._first_order)
        del frame
        self.params = [p for layer in self.names.layers for _, p in layer.params]
        known = {id(p) for p in self.params}
        self.params += [p for p in params if id(p) not in known]
        compiled = self._compiled_anything()
        for root in self.names.roots:
            if compiled and not is_compiled(root):
                # hooks added now would change the guards of code compiled around this module
                self.note(f"torch.compile is in use: the nan probe cannot replay `{self.names.label(root)}`, "
                          "so a non-finite value is reported without its first bad module.")
                continue
            first = self._first_calls.get(id(root))
            if first is not None:
                self.calls[id(root)] = first
            self._root_handles.append(root.register_forward_pre_hook(self._root_pre, with_kwargs=True))
        # Loss modules (called at the top level, no parameters of their own): a log(0) in a criterion is
        # found by replaying it on the outputs the model really produced.
        if not compiled:
            for mid, first in self._first_calls.items():
                module = first.module
                if mid in self.calls or not _parameterless(module) or len(self._root_handles) >= 64:
                    continue
                first.parameterless = True
                self._loss_modules.add(mid)
                if first.args is not None:
                    self.calls[mid] = first
                self._root_handles.append(module.register_forward_pre_hook(self._root_pre, with_kwargs=True))
        self.keep_rng = any(_stochastic(self.torch, m) for root in self.names.roots for m in root.modules())
        self._first_calls = {}
        self.emit(
            "layers",
            roots=self.names.root_labels,
            layers=[layer.label for layer in self.names.layers],
            types=[layer.module_type for layer in self.names.layers],
            parameters=len(self.params),
            order="execution" if self._first_order else "registration",
        )

    def _root_pre(self, module: Any, args: Any, kwargs: Any) -> None:
        if self.torch.compiler.is_compiling() or not self.enabled:
            return
        started = time.perf_counter()
        self._order += 1
        regions = autocast_state(self.torch) if self.torch._C._is_any_autocast_enabled() else ()
        self.calls[id(module)] = Call(module, args, kwargs, *(self._rng() if self.keep_rng else (None, None)),
                                      autocast=regions, parameterless=id(module) in self._loss_modules,
                                      order=self._order)
        self.call_gen[id(module)] = self.backward.calls
        self._spent += time.perf_counter() - started

    def _function_call(self, function: Any, args: tuple, kwargs: dict) -> None:
        if not self.enabled or self.torch.compiler.is_compiling():
            return
        self._order += 1
        regions = autocast_state(self.torch) if self.torch._C._is_any_autocast_enabled() else ()
        self.calls[id(function)] = Call(None, args, kwargs, autocast=regions, parameterless=True, order=self._order,
                                        function=function)
        self.call_gen[id(function)] = self.backward.calls

    def _current_calls(self, generation: int) -> list[Call]:
        found = [c for mid, c in self.calls.items() if self.call_gen.get(mid) == generation and c.args is not None]
        return sorted(found, key=lambda c: c.order)

    # -- the loss --------------------------------------------------------------------------------

    def _before_backward(self, tensors: Any) -> None:
        started = time.perf_counter()
        try:
            if self.loss_functions.armed:
                self.loss_functions.disarm(sys._getframe(1))
                if self.loss_functions.wrapped:
                    self.emit("loss-functions", functions=self.loss_functions.wrapped)
            self._check_loss(tensors)
        finally:
            self._spent += time.perf_counter() - started

    def _check_loss(self, tensors: Any) -> None:
        torch = self.torch
        ts = [t for t in (tensors if isinstance(tensors, (list, tuple)) else (tensors,)) if isinstance(t, torch.Tensor)]
        if not ts:
            return
        if self.names is None:
            self._discover(_graph_leaves(ts))
        scaled = self._scaled is not None and self._scaled[0] == id(ts[0])
        if scaled:
            ts = [self._scaled[1]]  # type: ignore[index]  # the loss before scaling: overflow is not NaN
        self._scaled = None
        loss = ts[0]
        # the graph of the last backward (0.1 µs), kept by reference until the next one (its saved tensors are freed
        # by the backward, its nodes and saved numbers are not): a non-finite gradient that no replay reproduces
        # (a sqrt at 0 in the loss code) can still be traced to the one op in it whose derivative is infinite there
        self._last_graph = loss.grad_fn
        if loss.device.type == "cpu" or self.sync:
            if len(ts) == 1 and loss.numel() == 1 and loss.is_floating_point():
                value = loss.item()  # one scalar: 0.3 µs on CPU, where isfinite().all() costs ~8 µs
                ok = math.isfinite(value)
                self._loss = _number(value)
            else:
                ok = all(finite(t.detach()) for t in ts[:4])
        else:
            flag = torch.stack([t.detach().isfinite().all() for t in ts[:4]]).all()
            self._defer("loss", flag)
            ok = True
        if ok:
            self.nonfinite_streak = 0
            return
        self.nonfinite_seen["loss"] += 1
        self.nonfinite_streak += 1
        if scaled and self.nonfinite_streak < self.scaler_after:
            return  # the scaler skips this step; normal unless it keeps happening
        if "loss" in self.localised:
            return
        self.localised.add("loss")
        calls = self._current_calls(self.backward.calls)
        site = user_site(sys._getframe(1))
        value = float(loss.detach().reshape(-1)[0]) if loss.numel() else float("nan")
        self._report("loss", calls, locate_forward, site, loss_value=_number(value), under_scaler=scaled, tensor=loss,
                     frame=sys._getframe(1))

    def _report(self, what: str, calls: list[Call], locate: Any, site: Any, tensor: Any = None, frame: Any = None,
                **extra: Any) -> None:
        step = self.step + 1
        if self.names is None or not calls:
            found: dict[str, Any] = {"phase": "forward" if what == "loss" else "backward", "module": None,
                                     "unlocalised": "no call of the model was recorded for this step"}
        else:
            try:
                found = locate(self.torch, calls, self.names)
            except Exception as exc:  # noqa: BLE001 - the sentinel's finding stands without localisation
                found = {"module": None, "unlocalised": f"replay failed: {type(exc).__name__}: {exc}"[:300]}
        if found.get("phase") == "input":
            found.update(self._batch_field())
        regions = sorted({f"{str(dtype).replace('torch.', '')} on {device}" for c in calls for device, dtype in c.autocast})
        if regions:
            found["autocast"] = ", ".join(regions)
        event: dict[str, Any] = {"what": what, "at_step": step, **found, **extra}
        if what == "loss" and found.get("outside_model") and not found.get("line"):
            self._op_watch_wanted = True
            if tensor is not None:
                event.update(self._graph_op(tensor, frame))
        if what == "grad" and not found.get("line") and not found.get("reproduced"):
            event.update(self._singular_op())
        if what == "loss" and not found.get("line") and found.get("phase") != "input" and frame is not None:
            if found.get("module") is None and not found.get("outside_model"):
                # no model call to replay (a policy's own method ran its layers): the same fallbacks as a loss
                # made outside the model
                self._op_watch_wanted = True
                if tensor is not None:
                    event.update(self._graph_op(tensor, frame))
            event.update(_constant_locals(frame, self.torch))
        if site is not None and what == "loss":
            event["backward_path"], event["backward_line"], event["backward_function"] = site
        lr = self._lr()
        if lr is not None:
            event["lr"] = lr
        if self.scaler_seen:
            event["loss_scale"] = self.scale
        self.emit("nonfinite", **event)

    def _graph_op(self, loss: Any, frame: Any) -> dict[str, Any]:
        """The op the bad loss's own graph shows making it (probes/nangraph.py), and the user code that computed
        the loss (the loop calling backward(), a framework's compute_loss), where the analysis looks for its line."""
        try:
            found = culprit(loss, self.torch)
        except Exception:  # noqa: BLE001 - the verdict stands without it
            return {}
        if found is None:
            return {}
        op, made_from = found
        code = list(self.loss_functions.loss_code)
        while frame is not None and is_library_file(frame.f_code.co_filename):
            frame = frame.f_back
        if frame is not None:
            code.append((frame.f_code.co_filename, frame.f_code.co_firstlineno, frame.f_code.co_name))
        out: dict[str, Any] = {"graph_op": op, "graph_op_inputs": made_from[:4],
                               "loss_code": [list(c) for c in dict.fromkeys(code)]}
        if self.loss_functions.loss_callees:
            # the helpers the loss code called (a loss object's __call__, its masked_mean) and the lines that ran
            out["loss_callees"] = [list(c) for c in self.loss_functions.loss_callees]
            out["loss_lines"] = [list(c) for c in self.loss_functions.loss_lines]
        return out

    def _batch_field(self) -> dict[str, Any]:
        """The DataLoader batch the step used, if it holds the non-finite values."""
        batch, info, index = self.data.last_batch, self.data.last_loader, self.data.last_index
        if batch is None:
            return {}
        for where, t in tensors_in(batch, self.torch, "batch"):
            if t.is_floating_point() and not finite(t):
                out: dict[str, Any] = {"batch_field": where, "batch_nonfinite_count": nonfinite_count(t),
                                       "batch_index": index}
                if info is not None:
                    out["loader"] = info.index
                    if info.site is not None:
                        out["loader_path"], out["loader_line"] = info.site[0], info.site[1]
                out.update(self._made_in_dataset())
                return out
        return {}

    def _made_in_dataset(self) -> dict[str, Any]:
        """Where the script's dataset code made the batch non-finite: its items fetched again, ops checked."""
        dataset = self.data.last_dataset() if self.data.last_dataset is not None else None
        try:
            made = locate_in_dataset(self.torch, dataset, self.data.last_indices)
        except Exception as exc:  # noqa: BLE001 - the batch finding stands without it
            return {"dataset_unlocalised": f"{type(exc).__name__}: {exc}"[:200]}
        if not made or not made.get("path"):
            return {}
        return {"made_op": made.get("op"), "made_path": made["path"], "made_line": made.get("line"),
                "made_function": made.get("function"), "made_item": made.get("item"),
                "dataset": type(dataset).__name__}

    def _lr(self, search: bool = True) -> float | None:
        opt = self._optimizer() if self._optimizer is not None else (self._find_optimizer() if search else None)
        if opt is None:
            return None
        try:
            return float(opt.param_groups[0]["lr"])
        except (KeyError, IndexError, TypeError, ValueError, RuntimeError):
            return None

    def _group_lrs(self) -> list[float] | None:
        """Every parameter group's learning rate, when the optimizer has several (report.html draws each)."""
        opt = self._optimizer() if self._optimizer is not None else None
        groups = getattr(opt, "param_groups", None)
        if not groups or len(groups) < 2:
            return None
        try:
            return [float(g["lr"]) for g in groups[:16]]
        except (KeyError, TypeError, ValueError, RuntimeError):
            return None

    def _find_optimizer(self) -> Any:
        """Before the first optimizer step: the optimizer that holds our parameters (error path only)."""
        import gc

        wanted = {id(p) for p in self.params}
        for obj in gc.get_objects():
            if issubclass(type(obj), self.torch.optim.Optimizer):
                if any(id(p) in wanted for g in obj.param_groups for p in g["params"]):
                    return obj
        return None

    # -- CUDA: values read one step late ------------------------------------------------------------

    def _defer(self, what: str, tensor: Any, extra: Any = None) -> None:
        self._pending.append((what, _Deferred(self.torch, tensor, self.step + 1), extra))
        if len(self._pending) > 2:
            self._drain(keep=2)

    def _drain(self, keep: int = 0) -> None:
        while len(self._pending) > keep:
            what, deferred, extra = self._pending.pop(0)
            values = deferred.values()
            if what == "grad":
                self._grad_values(deferred.step, extra, values, late=True)
                continue
            if all(values):
                continue
            self.sync = True  # from now on read at once, so the next occurrence is localised
            kind = "loss" if what == "loss" else "grad"
            self.nonfinite_seen[kind] += 1
            self._late(kind, deferred.step)

    def _late(self, what: str, step: int) -> None:
        if what in self.localised or "loss" in self.localised:
            return
        self.localised.add(what)
        self.emit("nonfinite", what=what, at_step=step, module=None, detected_late=True,
                  unlocalised="on CUDA the sentinel is read one step late, after the update; the next "
                  "occurrence is localised", lr=self._lr())

    # -- gradients and parameters ----------------------------------------------------------------------

    def before_step(self, step: int, optimizer: Any) -> None:
        started = time.perf_counter()
        try:
            self._before_step(step, optimizer)
        finally:
            self._spent += time.perf_counter() - started

    def _before_step(self, step: int, optimizer: Any) -> None:
        self._pre_calls += 1
        if self._optimizer is None or self._optimizer() is not optimizer:
            self._optimizer = weakref.ref(optimizer)
        if self.names is None:
            self._discover([p for g in optimizer.param_groups for p in g["params"]])
        if step >= self._next_check:
            started = time.perf_counter()
            self._check_grads(step)
            cost = time.perf_counter() - started
            if step > 1:
                self._check_cost.append(cost)
            if step < self.dense_steps or self._step_s <= 0:
                self._next_check = step + 1
                return
            if self._check_every == 0 or len(self._check_cost) % 16 == 0:
                # the median of recent checks (one preempted check must not space out the next ones),
                # judged again every 16 checks, not at every step
                typical = statistics.median(self._check_cost[-16:]) if self._check_cost else cost
                self._check_every = max(1, math.ceil(typical / (self.budget * self._step_s)))
            self._next_check = step + self._check_every

    def _norms(self, tensors: list[Any]) -> Any:
        torch = self.torch
        norms = torch._foreach_norm(tensors)
        try:
            return torch.stack(norms).float()
        except RuntimeError:  # mixed dtypes or devices
            device = norms[0].device
            return torch.stack([n.float().to(device) for n in norms])

    def _check_grads(self, step: int) -> None:
        pairs = []
        for i, p in enumerate(self.params):
            g = p.grad  # a property that builds a Python object each time: read once
            if g is not None and not g.is_sparse:
                pairs.append((i, g))
        if not pairs:
            return
        self.checked += 1
        index = [i for i, _ in pairs]
        grads = [g for _, g in pairs]
        if len(grads) <= PER_TENSOR_MAX and grads[0].device.type == "cpu":
            vector_norm = self.torch.linalg.vector_norm
            norms = [vector_norm(g).item() for g in grads]
        else:
            vec = self._norms(grads)
            if vec.device.type != "cpu" and not self.sync:
                self._defer("grad", vec, index)
                return
            norms = vec.tolist()
        total = self._grad_values(step, index, norms, late=False)
        if not math.isfinite(total):
            self._nonfinite_grads(step, pairs, norms)

    def _grad_values(self, step: int, index: list[int], norms: list[float], late: bool) -> float:
        """Total and per-layer norms of one check; on CUDA they arrive a step late."""
        total = math.hypot(*norms)  # one C call; inf if any norm is inf (NaN or not), else NaN if any is NaN
        if math.isinf(total) and any(math.isnan(n) for n in norms):
            total = float("nan")
        self._grad_norm = _number(total)
        self._grad_norm_step = step
        if step <= self.dense_steps or step % self.layer_every == 0 or not math.isfinite(total):
            self._layer_norms(step, dict(zip(index, norms, strict=True)), total)
        if late and not math.isfinite(total):
            self.sync = True
            self.nonfinite_seen["grad"] += 1
            self._late("grad", step)
        return total

    def _layer_norms(self, step: int, per_param: dict[int, float], total: float) -> None:
        if self.names is None or self.events_left <= 0:
            return
        self.events_left -= 1
        layers: list[float | str | None] = []
        i = 0
        for layer in self.names.layers:
            sq = 0.0
            seen = False
            for _ in layer.params:
                n = per_param.get(i)
                if n is not None:
                    sq += n * n
                    seen = True
                i += 1
            layers.append(_sig(math.sqrt(sq)) if seen else None)
        groups = self._group_lrs()
        extra = {"group_lrs": groups} if groups else {}
        self.emit("grad-norms", at_step=step, total=_sig(total), layers=layers, lr=self._lr(search=False), **extra)

    def _nonfinite_grads(self, step: int, pairs: list[tuple[int, Any]], norms: list[float]) -> None:
        bad = [i for (i, _), n in zip(pairs, norms, strict=True) if not math.isfinite(n)]
        # a norm can overflow while every element is finite (sum of squares in float32 on CUDA)
        bad = [i for i in bad if not finite(self.params[i].grad)]
        if not bad:
            return
        self.nonfinite_seen["grad"] += 1
        if "grad" in self.localised or "loss" in self.localised:
            return  # a non-finite loss already explains it
        self.localised.add("grad")
        names = self.names
        first = names.params.get(id(self.params[bad[0]]), "?") if names else "?"
        calls = self._current_calls(self.backward.calls - 1)
        self._report("grad", calls, locate_backward, None, first_nonfinite_parameter=first,
                     nonfinite_parameters=len(bad))

    def _singular_op(self) -> dict[str, Any]:
        """For non-finite gradients no replay placed: the one op of the last backward's graph whose derivative is
        infinite at a finite point (sqrt, rsqrt, a power below 1 at 0; a norm of a zero vector; acos/asin at ±1),
        with the user code that ran that backward, where the analysis looks for its line."""
        graph = getattr(self, "_last_graph", None)
        if graph is None:
            return {}
        try:
            op = singular_op(graph)
        except Exception:  # noqa: BLE001 - the verdict stands without it
            return {}
        # checked at the optimizer step: the user code that steps (and, usually, ran the backward and called the
        # loss code) and its caller, where the analysis looks for the op's line
        frames = [f for f in self.user_frames(sys._getframe(1)) if not in_torchdoctor(f.f_code.co_filename)][:2]
        if op is None or not frames:
            return {}
        return {"graph_op": op[0], "graph_backward": True, "graph_masked": op[1],
                "loss_code": [[f.f_code.co_filename, f.f_code.co_firstlineno, f.f_code.co_name] for f in frames]}

    def _check_params(self, step: int) -> None:
        params = [p.detach() for p in self.params if not p.is_sparse]
        if not params:
            return
        vec = self._norms(params)
        if vec.device.type != "cpu" and not self.sync:
            return  # checked on CUDA only once the sentinel turned synchronous
        bad = [i for i, n in enumerate(vec.tolist()) if not math.isfinite(n) and not finite(params[i])]
        if not bad or "parameters" in self.localised:
            return
        self.localised.add("parameters")
        self.nonfinite_seen["parameters"] += 1
        label = self.names.params.get(id(self.params[bad[0]]), "?") if self.names else "?"
        owner = self.names.owner.get(id(self.params[bad[0]])) if self.names else None
        self.emit("nonfinite", what="parameters", at_step=step, phase="update", module=owner, parameter=label,
                  nonfinite_parameters=len(bad), lr=self._lr())

    def after_step(self, step: int, optimizer: Any) -> dict[str, Any]:
        now = time.perf_counter()
        if self._last_t is not None:
            dt = now - self._last_t - self._spent  # the step's own time, without ours
            self._step_s = dt if self._step_s == 0.0 else 0.9 * self._step_s + 0.1 * dt
        self._last_t = now
        self.stepped_once = True
        if step % self.param_every == 0:
            self._check_params(step)
        if self.loss_functions.mode is not None and not self.loss_functions.armed:
            # disarmed inside backward(), itself run by the mode's handler (which takes the mode off the stack
            # meanwhile): popped here, at the optimizer step, where it is the innermost mode again
            self.loss_functions.tidy()
        if self._op_watch_wanted and 0 < self._step_s < self.loss_functions_max_step_s \
                and not self._compiled_anything():
            self._op_watch_wanted = False
            self.op_watch.arm(self.op_watch_steps)
        elif self.op_watch.mode is not None:
            self.op_watch.step_ended()
        if step == self.loss_functions_step and self.names is not None and not self.localised \
                and 0 < self._step_s < self.loss_functions_max_step_s and not self._compiled_anything():
            self.loss_functions.arm()  # the next loss computation, until its backward
        if step > 1 and not self.localised:  # the steady state: discovery and localisation are one-offs
            self._costs.append(self._spent + time.perf_counter() - now)
        self._spent = 0.0
        record: dict[str, Any] = {}
        if self._loss is not None:
            record["loss"] = self._loss
            self._loss = None
        if self._grad_norm is not None:
            record["grad_norm"] = self._grad_norm
            if self._grad_norm_step != step:  # CUDA: the previous check, read without stalling
                record["grad_norm_step"] = self._grad_norm_step
            self._grad_norm = None
        if self.scaler_seen and self.scale is not None:
            record["loss_scale"] = self.scale
        return record

    # -- GradScaler ------------------------------------------------------------------------------

    def _watch_layer_construction(self) -> None:
        """Remember the user's line that built each torch layer (`nn.Linear(...)` inside an `nn.Sequential(...)`):
        a replay that blames a layer called by a library container has no user line of its own to show."""
        module_class = self.torch.nn.Module
        original = module_class.__init__
        if getattr(original, "_records_construction", False):
            return
        probe = self

        def __init__(module: Any, *args: Any, **kwargs: Any) -> None:  # noqa: N807 - the method it wraps
            original(module, *args, **kwargs)
            try:
                if probe.enabled and len(BUILT) < MAX_BUILT and str(type(module).__module__).startswith("torch.nn."):
                    site = user_site(sys._getframe(1))
                    if site is not None:
                        BUILT[module] = site
            except Exception:  # noqa: BLE001 - a module that refuses weak references: a construction never fails
                pass

        __init__.__wrapped__ = original  # type: ignore[attr-defined]
        __init__._records_construction = True  # type: ignore[attr-defined]
        module_class.__init__ = transparent(__init__)

    def _wrap_scaler(self) -> None:
        try:
            from torch.amp.grad_scaler import GradScaler
        except ImportError:
            return
        probe = self
        original_scale, original_step, original_update = GradScaler.scale, GradScaler.step, GradScaler.update

        def scale(scaler: Any, outputs: Any) -> Any:
            result = original_scale(scaler, outputs)
            if probe.enabled and scaler.is_enabled() and isinstance(outputs, probe.torch.Tensor):
                probe.scaler_seen = True
                probe._scaled = (id(result), outputs)
            return result

        def step(scaler: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            before = probe._pre_calls
            result = original_step(scaler, optimizer, *args, **kwargs)
            if probe.enabled and scaler.is_enabled():
                if probe._scaler_opt is None:
                    probe._scaler_opt = weakref.ref(optimizer)
                if probe._scaler_opt() is optimizer:
                    probe._scaler_step(probe._pre_calls > before)
            return result

        def update(scaler: Any, new_scale: Any = None) -> None:
            original_update(scaler, new_scale)
            if probe.enabled and scaler.is_enabled():
                probe._read_scale(scaler)

        for fn, orig in ((scale, original_scale), (step, original_step), (update, original_update)):
            transparent(fn)
            fn.__wrapped__ = orig  # type: ignore[attr-defined]
            fn.__doc__ = orig.__doc__
        GradScaler.scale, GradScaler.step, GradScaler.update = scale, step, update

    def _scaler_step(self, stepped: bool) -> None:
        if stepped:
            self.skip_streak = 0
            return
        self.skipped += 1
        if self.stepped_once or self._pre_calls:
            self.skip_streak += 1
            self.max_skip_streak = max(self.max_skip_streak, self.skip_streak)
        if self.events_left > 0:
            self.events_left -= 1
            self.emit("scaler-skip", skipped=self.skipped, streak=self.skip_streak, scale=self.scale,
                      after_first_step=bool(self._pre_calls))

    def _read_scale(self, scaler: Any) -> None:
        scale = getattr(scaler, "_scale", None)
        if scale is None:
            return
        if scale.device.type == "cpu" or self.sync:
            self.scale = float(scale)
        elif self._pre_calls % 16 == 0 or self.skip_streak:
            self.scale = float(scale)  # a sync, but only every 16th step or while the scaler skips

    # -- the end -------------------------------------------------------------------------------------

    def _nonfinite_op(self, found: dict[str, Any]) -> None:
        self.emit("nonfinite-op", at_step=self.step + 1, **found)

    def finish(self, reason: str) -> None:
        self.op_watch.active = False
        self.op_watch.tidy()
        if self.loss_functions.armed:
            self.loss_functions.disarm(None)  # no backward came after the watched step
        try:
            self._drain()
        except Exception:  # noqa: BLE001 - a failed device at exit must not hide the summary
            pass
        costs = sorted(self._check_cost) or [0.0]
        own = sorted(self._costs) or [0.0]
        self.emit(
            "nan-summary",
            reason=reason,
            grad_checks=self.checked,
            nonfinite_loss=self.nonfinite_seen["loss"],
            nonfinite_grad=self.nonfinite_seen["grad"],
            nonfinite_parameters=self.nonfinite_seen["parameters"],
            scaler=self.scaler_seen,
            loss_scale=self.scale,
            skipped_steps=self.skipped,
            max_consecutive_skips=self.max_skip_streak,
            grad_check_us_median=round(costs[len(costs) // 2] * 1e6, 2),
            probe_us_per_step_median=round(own[len(own) // 2] * 1e6, 2),
            probe_us_per_step=round(sum(own) / len(own) * 1e6, 2),
            step_ms=round(self._step_s * 1e3, 3),
            models=self.names.root_labels if self.names else [],
        )


def _constant_locals(frame: Any, torch: Any, limit: int = 48) -> dict[str, Any]:
    """The non-finite tensors outside autograd held by the user code that called `backward()` on a non-finite loss.

    A value computed with no gradient (advantages normalised by a minibatch's std, a weight map divided by a count)
    enters the loss's graph as a constant: no graph node made it, so neither the graph walk nor a replay of the
    model's calls can name the op. When the loss is computed inline, that code's frame is still alive at its
    `backward()`, and its local variables show which such tensor is non-finite; the analysis names the line that
    last assigned it (doctor/analysis/nan.py). Cost: once, on a non-finite loss; at most `limit` locals checked."""
    while frame is not None and is_library_file(frame.f_code.co_filename):
        frame = frame.f_back
    if frame is None or "backward" not in linecache.getline(frame.f_code.co_filename, frame.f_lineno):
        return {}  # not the code that called backward() (a framework's fit() line): its locals are not the loss's
    names = []
    try:
        items = list(frame.f_locals.items())[:limit * 4]
        checked = 0
        for name, value in items:
            if not isinstance(value, torch.Tensor) or value.requires_grad or not value.is_floating_point():
                continue
            checked += 1
            if checked > limit:
                break
            if value.numel() and value.numel() <= 50_000_000 and not bool(value.detach().isfinite().all()):
                names.append(name)
    except Exception:  # noqa: BLE001 - a frame we cannot read: the verdict stands without it
        return {}
    if not names:
        return {}
    code = frame.f_code
    return {"constant_locals": names[:8], "locals_path": code.co_filename, "locals_function": code.co_name,
            "locals_first": code.co_firstlineno, "locals_line": frame.f_lineno}


def _parameterless(module: Any) -> bool:
    """A module with no parameters anywhere inside it: a loss or a metric, not a model."""
    try:
        return next(iter(module.parameters()), None) is None
    except Exception:  # noqa: BLE001 - a half-built module
        return False


def _stochastic(torch: Any, module: Any) -> bool:
    """A module whose forward draws random numbers in training (dropout and its relatives)."""
    if isinstance(module, torch.nn.modules.dropout._DropoutNd):
        return True
    p = getattr(module, "dropout", None)
    return isinstance(p, float) and p > 0


def _graph_leaves(tensors: list[Any], limit: int = 200_000) -> list[Any]:
    """The leaf tensors (parameters) an autograd graph accumulates into."""
    out: list[Any] = []
    seen: set[int] = set()
    todo = [t.grad_fn for t in tensors if t.grad_fn is not None]
    while todo and len(seen) < limit:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        variable = getattr(node, "variable", None)
        if variable is not None:
            out.append(variable)
            continue
        todo.extend(n for n, _ in node.next_functions)
    return out
