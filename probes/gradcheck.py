"""The gradcheck probe: every custom torch.autograd.Function of the user's that runs, checked once after the run.

Measures
--------
- `torch.autograd.Function.apply` is wrapped: a Function class whose
  `forward` is defined in one of the user's files is recorded at its first
  call — each argument's kind (tensor: shape, dtype, device, requires_grad;
  a number, string, None, dtype, device or plain function kept as is;
  anything else named by type), a copy of the tensors when they hold at
  most `copy_max_elements` elements in total, the user's line of the call
  and where `backward` is defined. Later calls of a known class cost one
  dictionary lookup;
- at the end of the run (`finish`, also after `--steps`), each recorded
  Function is checked with `torch.autograd.gradcheck` on double-precision
  inputs: the recorded values when they were copied, otherwise random
  inputs shaped like the recorded ones with every dimension size mapped to
  a small one (equal sizes stay equal, so matmul and broadcast shapes still
  fit; if the forward then fails, the recorded shapes are used when they are
  small enough). Integer tensors are only reproduced from copies. When the
  check fails, numerical and analytical Jacobians (central differences, one
  backward per output element) give the largest absolute error per input.
  A Function whose inputs cannot be rebuilt, whose forward fails or does
  not compute in double precision is reported as "not checked, because …",
  never as a pass. The time spent is reported on its own (`gradcheck_s`);
- the user's Functions that first ran after `max_functions` had been
  recorded: how many and their names (`custom-function-unrecorded` at the
  first, the totals with the results), reported as not checked.

Costs: < 1 µs per `Function.apply` call after the first of each class;
gradcheck once per Function after the run, bounded by `max_input_elements`
and `time_budget_s` (typically milliseconds per Function).

Symptoms (classified in doctor/analysis/gradcheck.py)
-----------------------------------------------------
- bad-custom-backward: gradcheck failed (`function`, `max_abs_error`, and
  the worst `input` / `input_index`). Not raised for a gradient transform:
  a forward that returns one of its inputs unchanged (identity, view) and
  a backward that returns one constant c ≠ 1 times grad_output for it
  (gradient reversal, -λ·grad, as in domain-adversarial training; gradient
  scaling): status `gradient-transform` with `scale`, reported as a note;
  nor for a surrogate gradient: a forward whose numerical gradient is zero
  at every point gradcheck perturbed (round, sign, a quantizer: its true
  gradient trains nothing, so the backward is a straight-through estimator
  on purpose), status `surrogate-gradient`, a note.
"""

from __future__ import annotations

import inspect
import time
import types
import warnings
from typing import Any

from torchdoctor.probes.base import Probe
from torchdoctor.probes.sites import as_dict, here
from torchdoctor.probes.transparent import transparent

SIMPLE = (type(None), bool, int, float, complex, str, bytes)
FUNCTIONS = (types.FunctionType, types.BuiltinFunctionType, types.MethodType)


class _Call:
    __slots__ = ("cls", "args", "copies", "site", "why_not")


class GradcheckProbe(Probe):
    name = "gradcheck"

    def install(self) -> None:
        import torch

        self.torch = torch
        opt = self.options
        self.copy_max = int(opt.get("copy_max_elements", 4096))
        self.max_elements = int(opt.get("max_input_elements", 256))
        self.max_outputs = int(opt.get("max_output_elements", 256))
        self.budget_s = float(opt.get("time_budget_s", 20.0))
        self.max_functions = int(opt.get("max_functions", 16))
        self.known: dict[type, bool] = {}
        self.calls: list[_Call] = []
        # The user's Functions that ran after `max_functions` were recorded: never checked, and the report
        # must say so (a silent pass is what the check exists to prevent).
        self.unrecorded = 0
        self.unrecorded_names: list[str] = []
        function = torch.autograd.Function
        self._original = function.__dict__["apply"]
        probe = self
        original = self._original.__func__

        def apply(cls: Any, *args: Any, **kwargs: Any) -> Any:
            if cls not in probe.known and probe.enabled:
                probe._first_call(cls, args, kwargs)
            return original(cls, *args, **kwargs)

        apply.__wrapped__ = original  # type: ignore[attr-defined]
        apply.__doc__ = original.__doc__
        function.apply = classmethod(transparent(apply))

    # -- recording ---------------------------------------------------------------------------------

    def _first_call(self, cls: Any, args: Any, kwargs: Any) -> None:
        try:
            self.known[cls] = user = self._is_users(cls)
            if user and len(self.calls) < self.max_functions:
                self._record(cls, args, kwargs)
            elif user:
                self.unrecorded += 1
                if len(self.unrecorded_names) < 8:
                    self.unrecorded_names.append(cls.__qualname__)
                if self.unrecorded == 1:  # a run that ends before finish() still says the limit was hit
                    self.emit("custom-function-unrecorded", function=cls.__qualname__, site=here(),
                              max_functions=self.max_functions)
        except Exception as exc:  # noqa: BLE001 - never reaches the script
            self.enabled = False
            self.emit("probe-error", where="apply", error=f"{type(exc).__name__}: {exc}"[:500])

    def _is_users(self, cls: Any) -> bool:
        forward = cls.__dict__.get("forward") or getattr(cls, "forward", None)
        code = getattr(getattr(forward, "__func__", forward), "__code__", None)
        return code is not None and self.is_user_file(code.co_filename)

    def _record(self, cls: Any, args: Any, kwargs: Any) -> None:
        torch = self.torch
        call = _Call()
        call.cls = cls
        call.site = here()
        call.why_not = None
        call.copies = None
        described = []
        total = 0
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                described.append({"kind": "tensor", "shape": list(a.shape), "dtype": str(a.dtype).replace("torch.", ""),
                                  "device": str(a.device), "requires_grad": bool(a.requires_grad)})
                total += a.numel()
            elif isinstance(a, SIMPLE) or isinstance(a, (torch.dtype, torch.device, torch.Size)) or _simple_sequence(a):
                described.append({"kind": "value", "value": a if isinstance(a, (bool, int, float, str, type(None)))
                                  else repr(a)[:60], "keep": a})
            elif isinstance(a, FUNCTIONS):
                described.append({"kind": "function", "value": getattr(a, "__qualname__", repr(a))[:60], "keep": a})
            else:
                described.append({"kind": "other", "type": type(a).__name__})
                if call.why_not is None:
                    call.why_not = (f"argument {i + 1} is a {type(a).__name__}, which cannot be rebuilt (only tensors, "
                                    "numbers, strings, dtypes, devices and plain functions can)")
        if kwargs and call.why_not is None:
            call.why_not = f"it is called with keyword arguments ({', '.join(kwargs)}), which apply does not forward"
        if call.why_not is None and total <= self.copy_max:
            call.copies = [a.detach().clone() if isinstance(a, torch.Tensor) else None for a in args]
        call.args = described
        self.calls.append(call)
        self.emit("custom-function", function=cls.__qualname__, site=call.site, backward=_backward_site(cls),
                  args=[{k: v for k, v in d.items() if k != "keep"} for d in described], copied=call.copies is not None)

    # -- the check, once, at the end -----------------------------------------------------------------

    def finish(self, reason: str) -> None:
        if not self.calls and not self.unrecorded:
            return
        torch = self.torch
        started = time.perf_counter()
        over = {"unrecorded": self.unrecorded, "unrecorded_names": self.unrecorded_names,
                "max_functions": self.max_functions}
        if reason in ("terminated", "interrupted"):  # the runner is waiting to stop the process: no time to check
            why = "the run was stopped (--timeout, a hang or Ctrl-C) before gradcheck could run"
            self.emit("gradcheck", functions=[self._result(c, "not-checked", why) for c in self.calls],
                      gradcheck_s=0.0, reason=reason, **over)
            return
        results = []
        with warnings.catch_warnings(), torch.enable_grad():
            warnings.simplefilter("ignore")
            for call in self.calls:
                if time.perf_counter() - started > self.budget_s:
                    results.append(self._result(call, "not-checked", f"the gradcheck time budget of {self.budget_s:.0f} s "
                                                "was spent on the Functions before it"))
                    continue
                t0 = time.perf_counter()
                try:
                    result = self._check(call)
                except Exception as exc:  # noqa: BLE001 - the user's code can raise anything here
                    result = self._result(call, "not-checked", f"gradcheck raised {type(exc).__name__}: {exc}"[:300])
                result["seconds"] = round(time.perf_counter() - t0, 4)
                results.append(result)
        self.emit("gradcheck", functions=results, gradcheck_s=round(time.perf_counter() - started, 4), reason=reason,
                  **over)

    def _result(self, call: _Call, status: str, why: str | None = None, **values: Any) -> dict[str, Any]:
        out = {"function": call.cls.__qualname__, "status": status, "site": call.site,
               "backward": _backward_site(call.cls)}
        if why:
            out["why"] = why
        out.update(values)
        return out

    def _check(self, call: _Call) -> dict[str, Any]:
        if call.why_not:
            return self._result(call, "not-checked", call.why_not)
        diff = [i for i, d in enumerate(call.args) if d["kind"] == "tensor" and d["requires_grad"]
                and d["dtype"].startswith(("float", "bfloat", "complex"))]
        if not diff:
            return self._result(call, "not-checked", "no floating-point input required a gradient at its first call")
        inputs, how = self._inputs(call, diff)
        if inputs is None:
            return self._result(call, "not-checked", how)
        fn = call.cls.apply
        torch = self.torch
        outputs = _tensors(fn(*inputs), torch)
        if outputs and not all(bool(torch.isfinite(o).all()) for o in outputs) and call.copies is None:
            inputs = [t.detach().abs().add(0.1).requires_grad_(t.requires_grad) if isinstance(t, torch.Tensor)
                      and t.is_floating_point() else t for t in inputs]
            how += " (made positive: the forward gave NaN/Inf on signed ones)"
            outputs = _tensors(fn(*inputs), torch)
        if outputs and not all(bool(torch.isfinite(o).all()) for o in outputs):
            return self._result(call, "not-checked", "its forward gives NaN or Inf on the inputs gradcheck would use")
        if not outputs:
            return self._result(call, "not-checked", "its forward returned no floating-point tensor")
        if any(o.dtype != torch.float64 for o in outputs if o.is_floating_point()):
            return self._result(call, "not-checked", "its forward does not compute in double precision on double inputs "
                                "(it casts), so finite differences would be too coarse to judge its backward")
        if sum(o.numel() for o in outputs) > self.max_outputs:
            return self._result(call, "not-checked", f"its outputs hold more than {self.max_outputs} elements even on "
                                "the smallest inputs that fit its forward")
        ok = torch.autograd.gradcheck(fn, tuple(inputs), eps=1e-6, atol=1e-5, rtol=1e-3, raise_exception=False)
        shapes = [list(inputs[i].shape) for i in diff]
        if ok:
            return self._result(call, "passed", inputs=how, shapes=shapes)
        scale = self._gradient_transform(fn, inputs, diff)
        if scale is not None:
            return self._result(call, "gradient-transform", inputs=how, shapes=shapes, scale=float(f"{scale:.6g}"))
        if self._piecewise_constant(fn, inputs, diff):
            return self._result(call, "surrogate-gradient", inputs=how, shapes=shapes)
        errors = self._errors(fn, inputs, diff)
        names = _forward_inputs(call.cls)
        for e in errors:
            if e["input_index"] <= len(names):
                e["input"] = names[e["input_index"] - 1]
        worst = max(errors, key=lambda e: e["max_abs_error"]) if errors else None
        return self._result(call, "failed", inputs=how, shapes=shapes, errors=errors,
                            max_abs_error=worst["max_abs_error"] if worst else None,
                            input_index=worst["input_index"] if worst else None,
                            input=worst.get("input") if worst else None)

    def _inputs(self, call: _Call, diff: list[int]) -> tuple[list[Any] | None, str]:
        torch = self.torch
        if call.copies is not None:
            total = sum(call.copies[i].numel() for i in diff)
            if total <= self.max_elements:
                built = []
                for i, d in enumerate(call.args):
                    copy = call.copies[i]
                    if copy is None:
                        built.append(d.get("keep"))
                    elif i in diff:
                        built.append(copy.to(torch.float64).requires_grad_(True))
                    else:
                        built.append(copy.to(torch.float64) if copy.is_floating_point() else copy)
                return built, "the recorded values, in double precision"
        if any(d["kind"] == "tensor" and not d["dtype"].startswith(("float", "bfloat", "complex"))
               for d in call.args):
            return None, ("an integer or boolean input was too large to keep at its first call, and its values "
                          "(indices, masks) cannot be made up")
        small = _small_sizes([d["shape"] for d in call.args if d["kind"] == "tensor"])
        for shapes, how in (
            ([[small[s] for s in d["shape"]] for d in call.args if d["kind"] == "tensor"],
             "random inputs with each dimension size mapped to a small one"),
            ([d["shape"] for d in call.args if d["kind"] == "tensor"], "random inputs of the recorded shapes"),
        ):
            if sum(_numel(shape) for shape, d in zip(shapes, [a for a in call.args if a["kind"] == "tensor"],
                                                     strict=True) if d["requires_grad"]) > self.max_elements:
                continue
            built = self._random(call, diff, shapes)
            try:
                call.cls.apply(*built)
            except Exception:  # noqa: BLE001 - the forward needs other shapes: try the next
                continue
            return built, how
        total = sum(_numel(d["shape"]) for i, d in enumerate(call.args) if i in diff)
        return None, (f"its inputs hold {total} elements (more than the {self.max_elements} gradcheck is given) and "
                      "its forward fails on smaller shapes")

    def _random(self, call: _Call, diff: list[int], shapes: list[list[int]]) -> list[Any]:
        torch = self.torch
        gen = torch.Generator().manual_seed(0)
        built = []
        it = iter(shapes)
        for i, d in enumerate(call.args):
            if d["kind"] != "tensor":
                built.append(d.get("keep"))
                continue
            shape = next(it)
            t = torch.randn(shape, dtype=torch.float64, generator=gen)
            device = d["device"]
            if device != "cpu":
                t = t.to(device)
            built.append(t.requires_grad_(i in diff))
        return built

    def _gradient_transform(self, fn: Any, inputs: list[Any], diff: list[int]) -> float | None:
        """The constant c when the forward is the identity of one input and the backward returns c × grad_output.

        Such a Function changes the gradient on purpose (gradient reversal in domain-adversarial training
        returns -λ·grad; gradient scaling returns λ·grad): gradcheck must fail on it, and the failure says
        nothing about a bug. A forward that computes anything, or a backward that is not one constant times
        the incoming gradient, is not recognised here and stays a failure.
        """
        torch = self.torch
        outputs = _tensors(fn(*inputs), torch)
        if len(outputs) != 1:
            return None
        out = outputs[0]
        same = [i for i in diff if inputs[i].shape == out.shape and torch.equal(inputs[i].detach(), out.detach())]
        if len(same) != 1 or out.numel() == 0 or out.grad_fn is None:
            return None
        gen = torch.Generator().manual_seed(1)
        scales = []
        for _ in range(2):
            g = torch.randn(out.shape, dtype=out.dtype, generator=gen).to(out.device)
            grads = torch.autograd.grad(fn(*inputs), [inputs[i] for i in diff], grad_outputs=g, allow_unused=True)
            for i, grad in zip(diff, grads, strict=True):
                if i != same[0] and grad is not None and bool(grad.abs().max() > 0):
                    return None  # the identity's other inputs get a gradient: not a pure transform
            grad = grads[diff.index(same[0])]
            if grad is None or grad.shape != g.shape:
                return None
            c = float((grad * g).sum() / (g * g).sum())
            if not bool(torch.allclose(grad, c * g, rtol=1e-6, atol=1e-9)):
                return None
            scales.append(c)
        if abs(scales[0] - scales[1]) > 1e-9 * max(1.0, abs(scales[0])) or abs(scales[0] - 1.0) < 1e-6:
            return None
        return scales[0]

    def _piecewise_constant(self, fn: Any, inputs: list[Any], diff: list[int], eps: float = 1e-6) -> bool:
        """The forward's numerical gradient is zero everywhere gradcheck looked (round, sign, a quantizer).

        Its true gradient cannot train anything, so a backward that returns something else is a surrogate on
        purpose (a straight-through estimator, as in VQ-VAE or quantization-aware training), not a mistake.
        """
        torch = self.torch
        with torch.no_grad():
            for i in diff:
                flat = inputs[i].view(-1)
                for e in range(flat.numel()):
                    keep = flat[e].item()
                    flat[e] = keep + eps
                    plus = torch.cat([o.reshape(-1) for o in _tensors(fn(*inputs), torch)])
                    flat[e] = keep - eps
                    minus = torch.cat([o.reshape(-1) for o in _tensors(fn(*inputs), torch)])
                    flat[e] = keep
                    if bool((plus != minus).any()):
                        return False
        return True

    def _errors(self, fn: Any, inputs: list[Any], diff: list[int], eps: float = 1e-6) -> list[dict[str, Any]]:
        """The largest |analytical - numerical| Jacobian entry per differentiable input."""
        torch = self.torch
        out = torch.cat([o.reshape(-1) for o in _tensors(fn(*inputs), torch)])
        analytical = []
        for j in range(out.numel()):
            grads = torch.autograd.grad(out[j], [inputs[i] for i in diff], retain_graph=True, allow_unused=True)
            analytical.append([torch.zeros_like(inputs[i]) if g is None else g for g, i in zip(grads, diff, strict=True)])
        errors = []
        with torch.no_grad():
            for k, i in enumerate(diff):
                x = inputs[i]
                flat = x.view(-1)
                worst = 0.0
                for e in range(flat.numel()):
                    keep = flat[e].item()
                    flat[e] = keep + eps
                    plus = torch.cat([o.reshape(-1) for o in _tensors(fn(*inputs), torch)])
                    flat[e] = keep - eps
                    minus = torch.cat([o.reshape(-1) for o in _tensors(fn(*inputs), torch)])
                    flat[e] = keep
                    numerical = (plus - minus) / (2 * eps)
                    for j in range(out.numel()):
                        worst = max(worst, abs(float(analytical[j][k].reshape(-1)[e]) - float(numerical[j])))
                errors.append({"input_index": i + 1, "max_abs_error": float(f"{worst:.4g}")})
        return errors


def _tensors(result: Any, torch: Any) -> list[Any]:
    items = result if isinstance(result, (tuple, list)) else [result]
    return [t for t in items if isinstance(t, torch.Tensor) and t.is_floating_point()]


def _simple_sequence(value: Any) -> bool:
    return isinstance(value, (tuple, list)) and len(value) <= 16 and all(isinstance(v, SIMPLE) for v in value)


def _small_sizes(shapes: list[list[int]]) -> dict[int, int]:
    """Each distinct dimension size -> a small one (1 stays 1; equal sizes stay equal)."""
    sizes = sorted({s for shape in shapes for s in shape if s > 1})
    mapping = {0: 0, 1: 1}
    for n, s in enumerate(sizes):
        mapping[s] = min(s, 2 + n)
    return mapping


def _numel(shape: list[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _forward_inputs(cls: Any) -> list[str]:
    """The names of forward's inputs after ctx (for the report: `input x`)."""
    forward = getattr(cls, "forward", None)
    try:
        names = list(inspect.signature(forward).parameters)
    except (TypeError, ValueError):
        return []
    return names[1:] if "setup_context" not in cls.__dict__ else names


def _backward_site(cls: Any) -> dict[str, Any] | None:
    backward = cls.__dict__.get("backward") or getattr(cls, "backward", None)
    fn = getattr(backward, "__func__", backward)
    code = getattr(fn, "__code__", None)
    if code is None:
        return None
    line = code.co_firstlineno
    try:
        lines, first = inspect.getsourcelines(fn)
        line = next((first + n for n, text in enumerate(lines) if text.lstrip().startswith("def ")), first)
    except (OSError, TypeError):
        pass
    return as_dict((code.co_filename, line, f"{cls.__qualname__}.backward"))

