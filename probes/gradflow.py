"""The gradflow probe: parameters no gradient reaches, where the graph is cut, and a loss that never moves.

Measures
--------
- at the optimizer step pre-hook of the first `dense_checks` steps and
  every `check_every` steps after, which of the optimizer's parameters hold
  a gradient (one attribute read per parameter);
- after `classify_after` checks, for the parameters that never had one:
  frozen (`requires_grad=False`), or trainable but outside the graph. For
  the latter, during the next forward of the model, a one-shot forward hook
  on the modules owning them records whether they ran and produced a
  tensor that requires grad, and `Tensor.detach`, `.numpy`, `.item` and
  `.tolist` are watched (patched for that one forward only) for calls from
  the user's code on tensors that require grad: the first such call after
  the owning module ran is where the graph was cut; before that, a use of
  the gradless parameters themselves with autograd off (a `no_grad` block
  inside a module's forward or around a helper) or a value with a graph
  written into a parameter's storage through `.data` (probes/dropped.py
  `_param_use`) is the cut, inside the model; when nothing was cut,
  the values made from those modules' outputs are followed until the next
  backward (probes/dropped.py): the last op that made one names where a
  term was built and then left out of the loss;
- the parameters of the script's models (probes/forwards.py) that hold a
  gradient but belong to no optimizer that steps: they are trained by
  nothing;
- the loss: the value of the scalar each backward starts from, on every
  backward of the first `dense_loss` and every `loss_every`-th after
  (one `.item()`: a device sync on CUDA, hence the spacing): first, last,
  and whether every sample was exactly equal.

Costs: < 1 µs per backward outside the loss samples (~2 µs each); ~0.1 µs
per parameter on the checked steps; the localisation forward, once, only
when a trainable parameter never got a gradient.

Symptoms (thresholds in rules/data/thresholds.toml, [gradflow]; classified
in doctor/analysis/gradflow.py). Not judged under DDP (the distributed
probe's business).
-----------------------------------------------------------------------------
- non-differentiable: trainable parameters whose module ran and produced a
  graph, yet no gradient reached them (with the cutting call when seen);
- frozen-parameters: trainable parameters whose module never ran, or
  parameters that get gradients but are in no optimizer;
- loss-not-decreasing: `min_loss_samples` or more loss samples, all
  exactly equal.
"""

from __future__ import annotations

import itertools
import math
import sys
import time
import weakref
from typing import Any

from torchdoctor.probes.base import Probe
from torchdoctor.probes.detached import DetachedSummands
from torchdoctor.probes.dropped import DroppedTerms
from torchdoctor.probes.forwards import forward_watch
from torchdoctor.probes.lossgraph import SoftmaxSites, find_double_softmax
from torchdoctor.probes.patches import backward_watch, compile_watch, user_site
from torchdoctor.probes.scalers import scaler_watch
from torchdoctor.probes.sites import as_dict, here
from torchdoctor.probes.transparent import transparent
from torchdoctor.probes.userframes import in_torchdoctor

CUT_OPS = ("detach", "numpy", "item", "tolist")


class GradflowProbe(Probe):
    name = "gradflow"

    def install(self) -> None:
        import torch
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self.torch = torch
        opt = self.options
        self.dense_checks = int(opt.get("dense_checks", 3))
        self.check_every = int(opt.get("check_every", 50))
        self.classify_after = int(opt.get("classify_after", 3))
        self.dense_loss = int(opt.get("dense_loss", 50))
        self.loss_every = int(opt.get("loss_every", 10))
        self.params: list[weakref.ref] = []
        self.params_of: weakref.ref | None = None
        self.got: list[bool] = []
        self.checks = 0
        self.optimizers: list[weakref.ref] = []
        self.classified = False
        self.localising: dict[str, Any] | None = None
        self.dropped = DroppedTerms(torch, self.is_user_file)
        self.backwards = 0
        self.loss: dict[str, Any] = {"samples": 0, "equal": True, "first": None, "last": None}
        self.loss_site: dict[str, Any] | None = None
        # probabilities into a logits loss (probes/lossgraph.py): graphs checked on the first backwards and
        # every softmax_every-th; once seen, one step with the softmax calls watched names the line
        self.softmax_samples = int(opt.get("softmax_samples", 4))
        self.softmax_every = int(opt.get("softmax_every", 100))
        self.softmax_sites = SoftmaxSites(torch)
        # a loss term cut off by detach()/.data (probes/detached.py): one step watched, after step detached_step
        self.detached = DetachedSummands(torch, self.emit)
        self.detached_step = int(opt.get("detached_step", 3))
        self.detached_done = False
        self.detached_armed_at = 0
        self.detached_last: tuple[int, float] | None = None
        self.detached_max_step_s = float(opt.get("detached_max_step_s", 1.0))
        self.compiles = compile_watch(torch)
        self.softmax_pending: dict[str, Any] | None = None
        self.softmax_done = False
        self.watch = forward_watch(torch, self)
        self.watch.subscribe(self, self._forward_start, self._forward_end)
        self.scalers = scaler_watch(torch)
        backward_watch(torch).subscribe(self, self._backward)
        register_optimizer_step_post_hook(self._any_step)

    def _any_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if len(self.optimizers) < 8 and not any(r() is optimizer for r in self.optimizers):
            self.optimizers.append(weakref.ref(optimizer))
        if not self.enabled:
            return
        if self.dropped.mode is not None and not self.dropped.armed:
            self.dropped.tidy()
        if self.detached.armed:
            # every optimizer's step judges the backwards before it; the watch ends two primary steps later, so
            # that a whole iteration is seen whichever of several optimizers is the primary one
            self.detached.on_step(optimizer, self.step)
            if self.step >= self.detached_armed_at + 2:
                self.detached.disarm()
        elif self.detached.mode is not None:
            self.detached.tidy()
        elif not self.detached_done and self.step >= self.detached_step:
            now = time.perf_counter()
            if self.detached_last is None or self.step == self.detached_last[0]:
                self.detached_last = (self.step, now)  # the watch waits for one whole step's duration
                return
            step_s = (now - self.detached_last[1]) / max(1, self.step - self.detached_last[0])
            self.detached_done = True
            # never with torch.compile (its guards would see the mode and recompile), nor on a step so slow that
            # an iteration under the mode would take long
            if not self.compiles.calls and step_s < self.detached_max_step_s:
                self.detached_armed_at = self.step
                self.detached.arm()

    # -- the loss -------------------------------------------------------------------------------------

    def _backward(self, tensors: Any) -> None:
        self.backwards += 1
        if self.localising is not None and "saved" in self.localising:
            self._close_window()  # the loss is computed: the forward and everything made from it were watched
        if self.detached.armed:
            self.detached.on_backward(tensors)
        n = self.backwards
        if (n <= self.softmax_samples or not n % self.softmax_every or self.softmax_sites.armed) \
                and not self.softmax_done:
            self._softmax_check(tensors)
        if n > self.dense_loss and n % self.loss_every:
            return
        root = tensors if isinstance(tensors, self.torch.Tensor) else None
        if root is None or root.numel() != 1:
            return
        value = float(root.detach())
        scale = self.scalers.scale_of(root)
        if scale is not None:  # GradScaler.scale(loss): the loss itself is the value over the scale
            value /= float(scale)
        loss = self.loss
        if loss["first"] is None:
            loss["first"] = value
            self.loss_site = here()
        elif value != loss["last"]:
            loss["equal"] = False
        loss["last"] = value
        loss["samples"] += 1
        loss["last_step"] = self.step

    def _softmax_check(self, tensors: Any) -> None:
        """A loss graph where a softmax's probabilities reach log_softmax / nll_loss: then one step to find its line."""
        root = tensors if isinstance(tensors, self.torch.Tensor) else (tensors[0] if isinstance(tensors, (list, tuple))
                                                                       and tensors else None)
        sites = self.softmax_sites
        found = find_double_softmax(root) if isinstance(root, self.torch.Tensor) else None
        if sites.armed:
            sites.disarm()
            made = sites.site_of(found[0]) if found else None
            sites.clear()
            if self.softmax_pending is not None:
                self._softmax_found(made)
            return
        if found is not None:
            self.softmax_pending = {"loss_op": found[1], "made_by": found[0].name(), "backward_site": here(),
                                    "at_step": self.step + 1}
            sites.arm()  # the next step's softmax calls say where they were made

    def _softmax_found(self, made: dict[str, Any] | None) -> None:
        pending, self.softmax_pending = self.softmax_pending, None
        self.softmax_done = True
        if pending is not None:
            self.emit("softmax-before-loss", site=made, **pending)

    # -- gradients ------------------------------------------------------------------------------------

    def before_step(self, step: int, optimizer: Any) -> None:
        if self.localising is not None and self.localising.get("done"):
            self._localised()
        if step > self.dense_checks and step % self.check_every:
            return
        if not self.params or self.params_of is not None and self.params_of() is not optimizer:
            # the first primary optimizer's parameters, read again when another one takes over (a second phase)
            self.params = [weakref.ref(p) for g in optimizer.param_groups for p in g["params"]]
            self.got = [False] * len(self.params)
            self.params_of = weakref.ref(optimizer)
            self.checks, self.classified = 0, False
        got = self.got
        for i, ref in enumerate(self.params):
            if not got[i]:
                p = ref()
                if p is not None and p.grad is not None:
                    got[i] = True
        self.checks += 1
        if self.checks == self.classify_after and not self.classified:
            self.classified = True
            self._classify()

    def _names(self) -> dict[int, tuple[str, Any, str]]:
        """id(parameter) -> (qualified name, owning module, owner's name) over the models seen."""
        out: dict[int, tuple[str, Any, str]] = {}
        for model in self.watch.live_models():
            for mod_name, module in model.named_modules():
                for p_name, p in module.named_parameters(recurse=False):
                    full = f"{mod_name}.{p_name}" if mod_name else p_name
                    out.setdefault(id(p), (full, module, mod_name or type(model).__name__))
        return out

    def _classify(self) -> None:
        names = self._names()
        ddp = any(type(m).__name__ in ("DistributedDataParallel", "FullyShardedDataParallel")
                  for m in self.watch.live_models())
        never = [p for p, got in zip((r() for r in self.params), self.got, strict=True) if p is not None and not got]
        frozen = [names.get(id(p), (f"parameter {i}",))[0] for i, p in enumerate(never) if not p.requires_grad]
        gradless = [p for p in never if p.requires_grad]
        in_optimizers = {id(p) for r in self.optimizers if r() is not None for g in r().param_groups
                         for p in g["params"]}
        in_optimizers |= {id(p) for p in (r() for r in self.params) if p is not None}
        orphans = []
        for model in self.watch.live_models():
            for name, p in model.named_parameters():
                if p.requires_grad and p.grad is not None and id(p) not in in_optimizers:
                    orphans.append(name)
        self.emit("gradflow-params", checks=self.checks, parameters=len(self.params), never=len(never),
                  frozen_in_optimizer=frozen[:20], frozen_count=len(frozen), not_in_optimizer=orphans[:20],
                  not_in_optimizer_count=len(orphans), ddp=ddp, models=len(self.watch.models))
        if gradless and not ddp:
            owners: dict[int, dict[str, Any]] = {}
            for p in gradless:
                name, module, owner = names.get(id(p), (None, None, None))
                if module is None:
                    continue
                entry = owners.setdefault(id(module), {"module": module, "name": owner, "params": [], "ran": False,
                                                       "grad_out": False, "seq": None})
                entry["params"].append(name)
            unnamed = sum(1 for p in gradless if id(p) not in names)
            self.localising = {"owners": owners, "unnamed": unnamed, "count": len(gradless), "calls": [],
                               "hooks": [], "seq": itertools.count(), "done": False, "armed": True,
                               "params": {id(p): p for p in gradless}}

    # -- localising the cut, during one forward ----------------------------------------------------------

    def _forward_start(self, module: Any) -> bool | None:
        loc = self.localising
        if loc is None or not loc["armed"] or not self.torch.is_grad_enabled() or self.watch.compiled:
            return None
        loc["armed"] = False
        for entry in loc["owners"].values():
            loc["hooks"].append(entry["module"].register_forward_hook(self._owner_ran(entry), always_call=True))
        self._patch_cut_ops(loc)
        self.dropped.on_cut = self._constructor_cut(loc)
        self.dropped.params = loc.get("params") or {}
        self.dropped.storages = {p.data_ptr(): p for m in self.watch.live_models() for p in m.parameters()
                                 if p.requires_grad and p.numel()}
        self.dropped.on_param_cut = self._parameter_cut(loc)
        self.dropped.arm()
        return True

    def _constructor_cut(self, loc: dict[str, Any]) -> Any:
        probe = self

        def cut(t: Any, op: str, site: tuple[str, int, str]) -> None:
            if len(loc["calls"]) < 32:
                call = {"op": f"{op}(...)", "seq": next(loc["seq"]), "site": as_dict(site)}
                loc["calls"].append(call)
                probe.dropped.note_read(t, call)

        return cut

    def _parameter_cut(self, loc: dict[str, Any]) -> Any:
        def cut(op: str, site: tuple[str, int, str], how: str) -> None:
            call = {"op": op, "seq": next(loc["seq"]), "site": as_dict(site), "how": how}
            loc["param_cut"] = call

        return cut

    def _owner_ran(self, entry: dict[str, Any]) -> Any:
        loc = self.localising
        probe = self
        tensor = self.torch.Tensor

        def hook(module: Any, args: Any, output: Any) -> None:
            entry["ran"] = True
            outs = output if isinstance(output, (tuple, list)) else [output]
            if any(isinstance(o, tensor) and o.requires_grad for o in outs):
                entry["grad_out"] = True
            probe.dropped.mark(output)
            if entry["seq"] is None and loc is not None:
                entry["seq"] = next(loc["seq"])

        return hook

    def _patch_cut_ops(self, loc: dict[str, Any]) -> None:
        tensor = self.torch.Tensor
        saved = {}
        for op in CUT_OPS:
            original = tensor.__dict__.get(op, getattr(tensor, op))
            saved[op] = (op in tensor.__dict__, original)
            setattr(tensor, op, self._cut_op(op, original, loc))
        loc["saved"] = saved

    def _cut_op(self, op: str, original: Any, loc: dict[str, Any]) -> Any:
        probe = self

        def watched(t: Any, *args: Any, **kwargs: Any) -> Any:
            # torchdoctor's own reads (a probe taking the loss's value at the backward) are no cut of the script's
            if len(loc["calls"]) < 32 and getattr(t, "requires_grad", False) and probe.dropped.made_from_owners(t) \
                    and not in_torchdoctor(sys._getframe(1).f_code.co_filename):
                site = user_site(sys._getframe(1))
                if site is not None and probe.is_user_file(site[0]):
                    call = {"op": f".{op}()", "seq": next(loc["seq"]), "site": as_dict(site)}
                    loc["calls"].append(call)
                    probe.dropped.note_read(t, call)
            return original(t, *args, **kwargs)

        return transparent(watched)

    def _forward_end(self, module: Any, output: Any, token: Any) -> None:
        """The watch stays open past the forward, until the backward of the loss computed from it: the owning
        modules may run later in the step (a framework's training_step calls them one by one), and the cut may
        sit in the loss code (`.detach()` on a term)."""

    def _close_window(self) -> None:
        loc = self.localising
        if loc is None or "saved" not in loc:
            return
        loc["dropped"] = self.dropped.disarm()
        tensor = self.torch.Tensor
        for op, (own, original) in loc.pop("saved").items():
            if own:
                setattr(tensor, op, original)
            else:
                delattr(tensor, op)
        for handle in loc["hooks"]:
            handle.remove()
        loc["hooks"] = []
        loc["done"] = True

    def _localised(self) -> None:
        loc, self.localising = self.localising, None
        assert loc is not None
        if "saved" in loc:  # no backward since the watched forward
            self._close_window()
        cut, unused, unknown = [], [], []
        # a parameter itself used with autograd off or written through `.data`: the cut is inside the model,
        # and a module that ran without producing a graph ran cut, not unused
        param_cut = loc.get("param_cut")
        for entry in loc["owners"].values():
            if not loc["done"]:
                unknown.append(entry)
            else:
                (cut if entry["ran"] and (entry["grad_out"] or param_cut) else unused).append(entry)
        first_seq = min((e["seq"] for e in cut if e["seq"] is not None), default=None)
        call = param_cut if cut and param_cut else None
        if first_seq is not None and call is None:
            # a host read of a value a graph op also used (`log = loss_term.item()`) did not cut the graph
            call = next(({k: v for k, v in c.items() if k != "read"} for c in loc["calls"]
                         if c["seq"] > first_seq and not c.get("read")), None)
        self.emit(
            "gradless",
            cut=[{"module": e["name"], "parameters": e["params"][:10]} for e in cut],
            unused=[{"module": e["name"], "parameters": e["params"][:10], "ran": e["ran"]} for e in unused],
            unknown=[{"module": e["name"], "parameters": e["params"][:10]} for e in unknown],
            call=call,
            dropped=loc.get("dropped") if call is None and cut else None,
            count=loc["count"],
            unnamed=loc["unnamed"],
        )

    # -- the end ----------------------------------------------------------------------------------------

    def finish(self, reason: str) -> None:
        self.detached.disarm()
        if self.softmax_sites.armed:  # the script ended within the watched step
            self.softmax_sites.disarm()
            self._softmax_found(None)
        self.softmax_sites.close()
        if not self.classified and self.checks:
            self.classified = True
            self._classify()
        if self.localising is not None:
            if "saved" in self.localising:  # the script ended inside the localising window
                self._close_window()
            self._localised()
        loss = self.loss
        self.emit(
            "gradflow-summary",
            loss_first=_finite(loss["first"]),
            loss_last=_finite(loss["last"]),
            loss_samples=loss["samples"],
            loss_equal=loss["equal"] and loss["samples"] > 1,
            loss_last_step=loss.get("last_step"),
            loss_site=self.loss_site,
            backwards=self.backwards,
            checks=self.checks,
        )


def _finite(value: float | None) -> float | str | None:
    if value is None or math.isfinite(value):
        return value
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
