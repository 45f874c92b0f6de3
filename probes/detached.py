"""A loss term cut off by `.detach()` / `.data` (or an integer copy): a constant added to a loss that still trains.

`loss = rec_loss + adv_loss` where `adv_loss` was computed from `D(fake).detach()`: the sum still has a
gradient (from `rec_loss`), every parameter still gets one, so the gradient-flow check sees nothing — but the
adversarial term is a constant and trains nothing. What makes it a mistake and not a deliberate stop-gradient
(SimSiam's `z.detach()`, a straight-through estimator, a TD target) is the shape: the detached value becomes a
scalar with no graph that is *added* (or subtracted) to a scalar that has one, and the graph it was cut from
reaches parameters that the optimizer stepping right after that backward updates. A detached tensor that
meets the model in a product, a cosine or a loss function (a target) is left alone.

For about one iteration (`DetachedSummands.arm`, from the first optimizer step after the primary's step
`detached_step` to two primary steps later; never when `torch.compile` was called, whose guards would see the
mode) a TorchFunctionMode follows values: the output of
`detach()` / `.data` of a tensor with a graph is marked with the user's line; an op on a marked value whose
output has no graph keeps the mark (a constant derived from it), and so does the number `.item()` gives for
one (`CutFloat`, a float that carries the mark through arithmetic during the step); an addition of a marked one-element constant
to a tensor with a graph marks the result as holding a cut-off term, and that mark follows every op. A
backward of a marked loss is judged at the next optimizer step: does the graph the detach cut reach that
optimizer's parameters? Then `detached-summand` is written with the detach's line.

The same holds for a value cut by an integer copy (`flow.int()`, I2D-Loc #8) or by the index of its maximum
(`pred.argmax(1).float()` inside an image-gradient loss, mobile-hair-segmentation #3), followed through a NumPy round trip
(`.numpy()` then `torch.tensor(...)`), and for a term built on such a constant that the script then made a leaf
requiring grad (`pts.requires_grad = True`): its gradient ends at that new leaf, never at the parameters the values
came from — unless the script reads that leaf's `.grad` (sending it back by hand, as GradCache does).

Cost: one iteration under the mode (a dictionary lookup per tensor argument of each op once something was
detached), only when a step takes under `detached_max_step_s`; nothing otherwise.
"""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

from torchdoctor.probes.heartbeat import beat
from torchdoctor.probes.sites import here
from torchdoctor.probes.userframes import is_library_file

ADDITIONS = {"add", "add_", "__add__", "__radd__", "__iadd__", "sub", "sub_", "__sub__", "__rsub__", "__isub__"}
JOINS = {"cat", "concat", "concatenate", "stack", "hstack", "vstack"}  # a detached part joined to live ones
INT_CASTS = {"int", "long", "short", "to", "type"}  # an integer copy of a value with a graph: a cut
# The index of a maximum (a hard class map, `pred.argmax(1).float()` in a loss): integers again, and as cut
INDEX_OPS = {"argmax", "argmin"}
FROM_ARRAYS = {"tensor", "from_numpy", "as_tensor"}  # back from NumPy: the array's mark carries over
MAX_FED = 16
MAX_NODES = 4000
MAX_ORIGINS = 32


class DetachedSummands:
    """Follows detached values through one step and reports a loss whose summand was cut from its graph."""

    def __init__(self, torch: Any, emit: Callable[..., None]) -> None:
        self.torch = torch
        self.emit = emit
        self.armed = False
        self.mode: Any = None
        self.marks: Any = None  # tensor -> ("const" | "mixed", frozenset of origin indices)
        self.origins: list[dict[str, Any]] = []  # {"site", "node"}: the detach's line, the graph it cut
        self.pending: list[frozenset[int]] = []  # origins of the backwards since the last optimizer step
        self.reported: set[tuple[Any, Any]] = set()
        # Detached values fed to a network (image2reverb: the generator's loss through D(cat(fake.detach(), f))):
        # {"origins", "module" (weakref), "node" (the output's grad_fn), "type"} per outermost module call
        self.fed: list[dict[str, Any]] = []
        self.fed_stack: list[Any] = []
        self.fed_pending: list[dict[str, Any]] = []  # fed calls the last backward went through
        self.fed_stepped: set[int] = set()  # parameters stepped since that backward
        self.fed_optimizer_params = 0
        self.fed_step = 0
        self.hooks: list[Any] = []
        # NumPy arrays made from marked tensors (`.int().cpu().numpy()`): id -> (the array, its mark)
        self.arrays: dict[int, tuple[Any, tuple[str, frozenset[int]]]] = {}
        # marked constants later made to require grad (`pts.requires_grad = True`), by origin: a loss term built
        # on one reaches that new leaf only, not the parameters its values came from
        self.rebuilt: dict[int, list[weakref.ref]] = {}
        self.grad_read: set[int] = set()  # origins whose rebuilt leaf's .grad the script read (GradCache)

    # -- the step under watch ------------------------------------------------------------------------

    def arm(self) -> None:
        if self.armed:
            return
        from torch.overrides import TorchFunctionMode
        from torch.utils.weak import WeakTensorKeyDictionary

        watch = self
        self.marks = WeakTensorKeyDictionary()
        self.origins = []
        self.pending = []
        self.arrays = {}
        self.rebuilt = {}
        self.grad_read = set()

        class DetachedWatch(TorchFunctionMode):
            def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                out = func(*args, **(kwargs or {}))
                if not watch.armed:  # left on the stack under a mode the script pushed later: inert
                    return out
                watch.ops += 1
                if not watch.ops % 256:
                    beat()  # ops running are training activity: a long forward under the mode is no hang
                try:
                    return watch._follow(func, args, out)
                except Exception:  # noqa: BLE001 - the watch never disturbs the script's op
                    return out

        self.ops = 0
        self.fed, self.fed_stack, self.fed_pending, self.fed_stepped = [], [], [], set()
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

        self.hooks = [register_module_forward_pre_hook(self._module_pre),
                      register_module_forward_hook(self._module_post, always_call=True)]
        self.mode = DetachedWatch()
        self.mode.__enter__()
        self.armed = True
        _ARMED[0] = True

    def disarm(self) -> None:
        if not self.armed:
            return
        self._judge_fed()
        for handle in self.hooks:
            handle.remove()
        self.hooks = []
        self.fed, self.fed_stack, self.fed_pending = [], [], []
        self.armed = False
        _ARMED[0] = False
        self.tidy()
        self.marks = None
        self.origins = []
        self.pending = []
        self.arrays = {}
        self.rebuilt = {}

    def tidy(self) -> None:
        """Pop the mode when it is the innermost one; under a mode the script entered later (a `with
        torch.device(...)` still open), popping would take the script's: ours stays inert until a later step."""
        from torch.overrides import _get_current_function_mode

        if self.mode is not None and _get_current_function_mode() is self.mode:
            self.mode.__exit__(None, None, None)
            self.mode = None

    def _follow(self, func: Any, args: Any, out: Any) -> Any:
        tensor = self.torch.Tensor
        name = getattr(func, "__name__", "")
        if name == "__get__" and self.rebuilt and args and getattr(getattr(func, "__self__", None), "__name__", "") \
                == "grad":
            for index, refs in self.rebuilt.items():  # a rebuilt leaf whose gradient the script uses itself
                if any(ref() is args[0] for ref in refs):
                    self.grad_read.add(index)
            return out
        if (name in INT_CASTS or name in INDEX_OPS) and args and isinstance(args[0], tensor) and isinstance(out, tensor) \
                and args[0].grad_fn is not None and not (out.is_floating_point() or out.is_complex()) \
                and len(self.origins) < MAX_ORIGINS and self.marks.get(args[0]) is None:
            # `flow.int()`: an integer copy of a value with a graph is as cut from it as a detach()
            self.origins.append({"site": here(), "node": args[0].grad_fn, "how": f"{name}()"})
            self.marks[out] = ("const", frozenset([len(self.origins) - 1]))
            return out
        if self.origins and name == "numpy" and args and isinstance(args[0], tensor):
            mark = self.marks.get(args[0])
            if mark is not None and mark[0] == "const" and len(self.arrays) < MAX_ORIGINS:
                self.arrays[id(out)] = (out, mark)  # the array keeps the mark through NumPy
            return out
        if self.arrays and name in FROM_ARRAYS and args and isinstance(out, tensor):
            kept = self.arrays.get(id(args[0]))
            if kept is not None and kept[0] is args[0]:
                self.marks[out] = kept[1]
            return out
        if isinstance(out, tensor) and not out.requires_grad and len(self.origins) < MAX_ORIGINS \
                and not self.torch.is_grad_enabled():
            # An op under torch.no_grad() (a `with` block, a decorated loss function) on a tensor that has a graph:
            # its result is as cut from that graph as a detach() (a generator's adversarial term through D(fake)
            # computed with autograd off, then added to the loss)
            flat = [item for arg in args[:2] for item in (arg[:8] if isinstance(arg, (list, tuple)) else (arg,))]
            source = next((a for a in flat if isinstance(a, tensor) and a.grad_fn is not None
                           and self.marks.get(a) is None), None)
            if source is not None:
                site, stack = _caller_site()
                self.origins.append({"site": site, "node": source.grad_fn, "how": "no_grad", "stack": stack})
                self.marks[out] = ("const", frozenset([len(self.origins) - 1]))
                return out
        if name in ("detach", "__get__") and args and isinstance(args[0], tensor) and isinstance(out, tensor):
            # Tensor.detach() or the .data getter of a tensor with a graph (not a leaf's: p.data is an update)
            source = args[0]
            if name == "__get__" and getattr(func, "__self__", None) is not None \
                    and getattr(func.__self__, "__name__", "") != "data":
                return out
            if source.grad_fn is not None and len(self.origins) < MAX_ORIGINS:
                self.origins.append({"site": here(), "node": source.grad_fn})
                self.marks[out] = ("const", frozenset([len(self.origins) - 1]))
            return out
        if name in ("item", "__float__") and isinstance(out, float) and args and isinstance(args[0], tensor):
            # `.detach().item()`: the cut-off value goes on as a Python number; it keeps its mark for this step
            mark = self.marks.get(args[0])
            if mark is not None:
                return CutFloat.of(out, mark[1])
            return out
        if not self.origins:
            return out  # nothing detached yet: nothing to follow
        if isinstance(out, tuple) and not isinstance(out, tensor):
            # several outputs (torch.linalg.lstsq's named tuple, torch.max's values and indices): each one
            for item in out[:8]:
                if isinstance(item, tensor):
                    self._mark(name, args, item)
            return out
        if not isinstance(out, tensor):
            return out
        return self._mark(name, args, out)

    def _mark(self, name: str, args: Any, out: Any) -> Any:
        """The mark an op's tensor output takes from its arguments'."""
        tensor = self.torch.Tensor
        const: set[int] = set()
        mixed: set[int] = set()
        scalar_const = False
        flat = [item for arg in args for item in (arg if isinstance(arg, (list, tuple)) else (arg,))]
        rebuilt: set[int] = set()
        for arg in flat:  # torch.cat([...]) takes its tensors in a list
            if isinstance(arg, CutFloat):
                const |= arg.origins
                scalar_const = True
                continue
            if not isinstance(arg, tensor):
                continue
            mark = self.marks.get(arg)
            if mark is None or mark[0] == "part":
                continue
            if mark[0] == "mixed":
                mixed |= mark[1]
            elif arg.requires_grad and arg.grad_fn is None:
                rebuilt |= mark[1]  # a cut-off constant the script made a leaf that requires grad
                for index in mark[1]:
                    refs = self.rebuilt.setdefault(index, [])
                    if len(refs) < 4 and not any(ref() is arg for ref in refs):
                        refs.append(weakref.ref(arg))
            else:
                const |= mark[1]
                scalar_const = scalar_const or arg.numel() == 1
        if rebuilt and out.requires_grad:
            self.marks[out] = ("mixed", frozenset(rebuilt | mixed))  # the term's graph ends at that new leaf
            return out
        if not const and not mixed:
            return out
        if not out.requires_grad:
            self.marks[out] = ("const", frozenset(const | mixed))
            return out
        if const and not mixed and name in JOINS:
            self.marks[out] = ("part", frozenset(const))  # a detached part next to live ones, as a network's input
            return out
        if const and scalar_const and name in ADDITIONS and out.numel() == 1:
            # A constant term added to a loss that has a graph; but `x - x.detach()` (DiCE's magic box, a value
            # shift) adds a value to the very tensor it was cut from, whose gradient still flows: not a lost term.
            nodes = {id(a.grad_fn) for a in args if isinstance(a, tensor) and a.grad_fn is not None}
            mixed |= {i for i in const if id(self.origins[i]["node"]) not in nodes}
        if mixed:
            self.marks[out] = ("mixed", frozenset(mixed))
        return out

    # -- judged at the optimizer step --------------------------------------------------------------

    # -- a detached value as a network's input -------------------------------------------------------

    def _module_pre(self, module: Any, args: Any) -> None:
        if not self.armed or not self.origins or len(self.fed) >= MAX_FED:
            self.fed_stack.append(None)
            return
        if any(entry is not None for entry in self.fed_stack):
            self.fed_stack.append(None)  # inside a fed call: the outermost module is the network
            return
        origins: set[int] = set()
        for arg in args if isinstance(args, tuple) else ():
            mark = self.marks.get(arg) if isinstance(arg, self.torch.Tensor) else None
            if mark is not None and mark[0] in ("const", "part"):
                origins |= mark[1]
        self.fed_stack.append(frozenset(origins) if origins else None)

    def _module_post(self, module: Any, args: Any, output: Any) -> None:
        if not self.fed_stack:
            return
        origins = self.fed_stack.pop()
        node = getattr(output, "grad_fn", None) if isinstance(output, self.torch.Tensor) else None
        if origins and node is not None and self.armed:
            try:
                ref = weakref.ref(module)
            except TypeError:
                return
            self.fed.append({"origins": origins, "module": ref, "node": node, "type": type(module).__name__})

    def _judge_fed(self) -> None:
        """The fed calls of the last backward, once the optimizers that followed it stepped: a network that none
        of them trains, fed a value cut from parameters they do train, passes no gradient back to those."""
        pending, stepped = self.fed_pending, self.fed_stepped
        self.fed_pending, self.fed_stepped = [], set()
        if not pending or not stepped:
            return
        for record in pending:
            module = record["module"]()
            if module is None:
                continue
            own = {id(p) for p in module.parameters()}
            if not own or own & stepped:
                continue  # a parameterless function, or a network this step trains (D's own step, a TD target)
            for index in sorted(record["origins"]):
                origin = self.origins[index]
                site = origin.get("site")
                key = (site or {}).get("path"), (site or {}).get("line")
                if key in self.reported:
                    continue
                reached = _parameters_reached(origin["node"], stepped)
                if reached:
                    self.reported.add(key)
                    self.emit("detached-summand", site=site, at_step=self.fed_step, parameters_reached=reached,
                              optimizer_parameters=self.fed_optimizer_params, node=origin["node"].name(),
                              through=record["type"])

    def on_backward(self, tensors: Any) -> None:
        root = tensors if isinstance(tensors, self.torch.Tensor) else None
        if root is None or self.marks is None:
            return
        self._judge_fed()
        if self.fed and root.grad_fn is not None:
            graph = _nodes(root.grad_fn)
            self.fed_pending = [r for r in self.fed if id(r["node"]) in graph]
            self.fed = [r for r in self.fed if id(r["node"]) not in graph]
        mark = self.marks.get(root)
        if mark is not None and mark[0] == "mixed":
            self.pending.append(mark[1])

    def on_step(self, optimizer: Any, step: int) -> None:
        pending, self.pending = self.pending, []
        if self.fed_pending:
            params = [id(p) for g in optimizer.param_groups for p in g["params"]]
            self.fed_stepped.update(params)
            self.fed_optimizer_params, self.fed_step = len(params), step
        if not pending:
            return
        params = {id(p) for g in optimizer.param_groups for p in g["params"]}
        for index in sorted(set().union(*pending)):
            if index in self.grad_read:
                continue  # the rebuilt leaf's gradient is used by the script (sent back by hand: GradCache)
            origin = self.origins[index]
            site = origin.get("site")
            key = (site or {}).get("path"), (site or {}).get("line")
            if key in self.reported:
                continue
            reached = _parameters_reached(origin["node"], params)
            if reached:
                self.reported.add(key)
                extra = {"cut": origin["how"]} if origin.get("how") else {}
                if origin.get("stack"):
                    extra["stack"] = origin["stack"]
                if index in self.rebuilt:
                    extra["rebuilt_leaf"] = True
                self.emit("detached-summand", site=site, at_step=step, parameters_reached=reached,
                          optimizer_parameters=len(params), node=origin["node"].name(), **extra)


def _caller_site() -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """The user's line that ran an op, outside the forward of the script's own modules (`d_out = D(fake)`, not
    `return self.net(x)` inside D), and the user's frames around it (innermost first, at most 8: the analysis
    looks there for the `with torch.no_grad():` that turned autograd off, when a shared helper ran the op)."""
    import sys

    frame = sys._getframe(2)
    site, stack = None, []
    for _ in range(48):
        if frame is None or len(stack) >= 8:
            break
        code = frame.f_code
        if not is_library_file(code.co_filename):
            here_ = {"path": code.co_filename, "line": frame.f_lineno, "function": code.co_name}
            stack.append(here_)
            owner = frame.f_locals.get("self") if code.co_name == "forward" else None
            if site is None and (owner is None or not hasattr(owner, "_forward_hooks")):
                site = here_
        frame = frame.f_back
    return site or (stack[0] if stack else None), stack


_ARMED = [False]  # read by CutFloat's arithmetic: marks are kept only during the watched step


class CutFloat(float):
    """The Python number `.item()` gave for a detached value during the watched step, with the detach's mark.

    It is a float in every way the script can see (value, repr, hash, isinstance, pickling as a plain float);
    arithmetic keeps the mark only while the step is watched, so a running total soon is a plain float again."""

    origins: frozenset[int]

    @classmethod
    def of(cls, value: float, origins: frozenset[int]) -> CutFloat:
        made = cls(value)
        made.origins = origins
        return made

    def __reduce__(self) -> tuple[Any, tuple[float]]:
        return float, (float(self),)

    def _keep(self, value: Any) -> Any:
        if _ARMED[0] and type(value) is float:
            return CutFloat.of(value, self.origins)
        return value

    def __add__(self, other: Any) -> Any:
        return self._keep(float.__add__(self, other))

    def __radd__(self, other: Any) -> Any:
        return self._keep(float.__radd__(self, other))

    def __sub__(self, other: Any) -> Any:
        return self._keep(float.__sub__(self, other))

    def __rsub__(self, other: Any) -> Any:
        return self._keep(float.__rsub__(self, other))

    def __mul__(self, other: Any) -> Any:
        return self._keep(float.__mul__(self, other))

    def __rmul__(self, other: Any) -> Any:
        return self._keep(float.__rmul__(self, other))

    def __truediv__(self, other: Any) -> Any:
        return self._keep(float.__truediv__(self, other))

    def __rtruediv__(self, other: Any) -> Any:
        return self._keep(float.__rtruediv__(self, other))

    def __neg__(self) -> Any:
        return self._keep(float.__neg__(self))


def _nodes(root: Any) -> set[int]:
    """The ids of the autograd nodes of the graph from `root` (breadth first, at most MAX_NODES)."""
    seen: set[int] = set()
    queue = deque([root])
    while queue and len(seen) < MAX_NODES:
        current = queue.popleft()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        queue.extend(child for child, _ in getattr(current, "next_functions", ()) if child is not None)
    return seen


def _parameters_reached(node: Any, params: set[int]) -> int:
    """How many of `params` the graph from `node` reaches (breadth first, at most MAX_NODES nodes)."""
    seen: set[int] = set()
    found: set[int] = set()
    queue = deque([node])
    while queue and len(seen) < MAX_NODES:
        current = queue.popleft()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        variable = getattr(current, "variable", None)
        if variable is not None and id(variable) in params:
            found.add(id(variable))
        for child, _ in getattr(current, "next_functions", ()):
            if child is not None:
                queue.append(child)
    return len(found)
