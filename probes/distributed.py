"""The distributed probe: DDP run-time checks inside every rank of a torchrun job.

It installs only in a process started by torchrun with more than one rank
(WORLD_SIZE > 1); in a single-process run it does nothing and costs nothing.
The cross-rank conclusions (hangs, crashes, stragglers, checks that need
every rank's view) are drawn afterwards in `torchdoctor.analysis.distributed`.

What it observes, through thin class-level wrappers (the original is always
called, with the same arguments, and its result returned unchanged):

- `DistributedSampler.__iter__` / `set_epoch`: every pass over a sampler
  with its epoch and whether set_epoch was ever called (`sampler-pass`) ->
  sampler-epoch-not-set when two passes of a shuffling sampler had the same
  epoch (observed, not guessed from the code);
- `DistributedDataParallel.__init__`: each DDP model, its settings and call
  site (`ddp-model`);
- after the backward of the first `unused_check_steps` optimizer steps (the
  optimizer's pre-step hook): parameters of each DDP model that require a
  gradient and have none (`ddp-unused`) -> unused-parameters;
- `DistributedDataParallel.forward`: per optimizer step, the forwards with
  gradient grad-mode on (micro-steps) and those of them with DDP's gradient
  synchronisation on (each one all-reduces every bucket in its backward;
  `no_sync()` turns it off), and the rank's own time before the all-reduce
  (from the end of the previous optimizer step to the end of its forward:
  data loading and forward) -> the step record's `distributed` numbers ->
  accumulation-without-no-sync, straggler;
- during the first `expand_watch_forwards` DDP forwards, a TorchFunctionMode
  notes `.expand()` / `.expand_as()` of the model's parameters with the
  user's line (`ddp-expand`) -> expand-in-forward;
- `torch.save`: each call with its path and the user's line (`save`) ->
  save-on-all-ranks when several ranks save at the same line;
- at the first step: the backend and world size (`ddp-setup`), so the
  analysis knows NCCL (GPU) from gloo;
- during the first `bypass_watch_steps` optimizer steps, a global module
  forward hook pair: the outermost grad-mode forwards run outside every DDP
  forward whose trainable parameters the optimizer steps, with the user's
  line that called them: a DDP model's own parameters in a step with no DDP
  forward (the model trained around its wrapper: `bypass` in
  `ddp-unsynced-step`), or parameters no DDP model owns (a loss module with
  its own weights, never wrapped: `ddp-foreign-forward`) ->
  ddp-ranks-diverged at that call; when the function that called it received
  the module as an argument, the walk goes up to the caller that chose it
  (`self._compute_loss(unwrapped_model, inputs)`);
- in the DDP forwards of the same first steps, in-place writes to the DDP
  model's parameters outside any optimizer step (a local learning rule's
  `p.data.add_(...)`): DDP averages gradients only, so such an update stays
  rank-local (`ddp-parameter-write`, the first one, with the user's line; the
  written parameter joins the checksum) -> ddp-ranks-diverged at that line;
- during the first `local_write_watch_steps` (16) steps, the in-place methods of nn.Parameter and torch's
  in-place `_foreach_*` functions: each user line that writes a DDP model's parameter or gradient outside
  the DDP forward and the optimizer's own update (a QK-clip in a custom step, a dead-unit reset, a clip
  under `if rank == 0`), with its count on this rank (`ddp-local-write`, `ddp-local-writes`) ->
  ddp-ranks-diverged at a line that wrote on some ranks only, else at one that wrote parameter values.
  The checksum samples 8 parameters evenly spaced (a drift confined to a middle layer escaped the first
  and last).

Cost: the forward wrapper ~1-1.5 µs per DDP forward (timed A/B against the
unwrapped forward in one process), `after_step` ~0.3 µs plus ~40 bytes in the
step event; the watched first forward a few µs per operator, once; one event
per sampler pass, torch.save call and DDP model; the bypass watch a hook
call per module forward during its first 3 steps only (then removed), and a
walk over the parameters of each outermost forward outside the wrappers
then; the parameter-write watch a Python call per torch op inside the DDP
forwards of those 3 steps (stopped at the first write found), nothing later; the local-write watch a Python
call and a dict lookup per in-place Parameter method or `_foreach_*` call during its 16 steps (then the
originals are put back); the checksum 8 slices summed instead of 2, on sampled steps only.
The whole job's slowdown is in bench/bench_distributed.py.
"""

from __future__ import annotations

import functools
import os
import sys
import time
import weakref
from typing import Any

import torch

from torchdoctor.probes.base import Probe
from torchdoctor.probes.transparent import transparent
from torchdoctor.probes.userframes import in_torchdoctor, is_library_file


class DistributedProbe(Probe):
    name = "distributed"

    def install(self) -> None:
        self.active = _env_int("WORLD_SIZE", 1) > 1
        if not self.active:
            for hook in ("before_step", "after_step"):  # one process: nothing to do at any step
                self.session.stop_calling(self, hook)
            return
        self.check_steps = int(self.options.get("unused_check_steps", 3))
        self.expand_left = int(self.options.get("expand_watch_forwards", 1))
        self.max_events = int(self.options.get("max_events", 32))
        self.models: list[weakref.ref] = []
        self.samplers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.saves = 0
        self.expands = 0
        self.setup_sent = False
        self.forward_site_sent = False
        # Ranks that drift apart: a checksum of a few parameters after steps 1, 2, 4, … 64, then every 64th,
        # compared across ranks afterwards; and the steps no gradient all-reduce reached, with their backward.
        self.next_checksum = 1
        self.max_unsynced = int(self.options.get("max_unsynced_events", 4))
        self.unsynced_sent = 0
        # A parameter of the wrapped model replaced by a new one after DDP was built: DDP's gradient hooks stay on
        # the old one, so the new one's gradient is never all-reduced. Module.__setattr__ is watched from the first
        # DDP construction until step `unused_check_steps` only (where a parameter was assigned), then restored.
        self.setattr_original: Any = None
        self.assigned: dict[int, dict[str, Any]] = {}  # id(new parameter) -> the user's line that assigned it
        self.replaced_sent: set[int] = set()
        # Forwards that bypass every DDP wrapper: during the first `bypass_watch_steps` steps a global module hook
        # notes the outermost grad-mode forwards run outside any DDP forward that reach trainable parameters (a
        # reference to the model kept from before wrapping, a submodule called directly, a loss module with its own
        # weights never wrapped), with the user's line that called them; removed after those steps.
        self.bypass_steps = int(self.options.get("bypass_watch_steps", 3))
        self.bypass_hooks: list[Any] = []
        self.ddp_depth = 0  # inside a DDP forward
        self.outside_depth = 0  # inside an outermost forward run outside every DDP wrapper
        self.ddp_params: set[int] = set()
        self.foreign_sent = False
        self.foreign_ids: set[int] = set()
        # A parameter written in place inside a DDP forward (a local learning rule, `.data.add_`): DDP averages
        # gradients only, so such an update stays rank-local. Watched in the DDP forwards of the first
        # `bypass_watch_steps` steps; the written parameter joins the checksum.
        self.write_watch = bool(self.options.get("param_write_watch", True))
        self.written_ids: set[int] = set()
        # A parameter (or its gradient) written in place by the script outside the DDP forward and outside the
        # optimizer's own update (a QK-clip in a custom step, a dead-unit reset, a clip under `if rank == 0`):
        # DDP does not see it, so a value from this rank's batch, generator or branch stays local. During the
        # first `local_write_watch_steps` steps the in-place methods of nn.Parameter and torch's in-place
        # `_foreach_*` functions are wrapped; each new user line that writes a DDP model's parameter or gradient is
        # noted (`ddp-local-write`), and the lines' counts on this rank at the end (`ddp-local-writes`): the
        # analysis compares them across ranks when the replicas drift apart.
        self.local_steps = int(self.options.get("local_write_watch_steps", 16))
        self.local_patched: list[tuple[Any, str, bool, Any]] = []
        self.local_params: dict[int, tuple[str, Any]] = {}
        self.local_sites: dict[tuple[str, int], dict[str, Any]] = {}
        # `p.data.mul_(…)`: `.data` is a plain tensor sharing the parameter's storage, so the Parameter method
        # wrappers never see the write. During the same steps the `data` property of nn.Parameter notes each alias
        # the script takes of a DDP model's parameter with its version counter; at the step's end an alias whose
        # version moved was written in place (a read, `p.data.norm()`, is not a write).
        self.data_reads: list[tuple[Any, int, Any, dict[str, Any]]] = []
        self._reset_step()
        from torchdoctor.probes.patches import backward_watch
        backward_watch(torch).subscribe(self, self._backward)
        self._wrap_sampler()
        self._wrap_ddp()
        self._wrap_save()

    # -- per step ---------------------------------------------------------------------

    def _reset_step(self) -> None:
        self.micro = 0
        self.syncs = 0
        self.tail_unsynced = False  # a DDP forward with sync off came after the step's last synchronised one
        self.backward_site: dict[str, Any] | None = None
        self.nosync_site: dict[str, Any] | None = None  # the user's line of this step's last `no_sync()` call
        self.outside: list[dict[str, Any]] = []  # this step's outermost forwards outside every DDP wrapper
        self.local_s: float | None = None
        self.step_end = time.perf_counter()

    def before_step(self, step: int, optimizer: Any) -> None:
        if not self.active:
            return
        if step <= self.check_steps and self.models:
            self._check_unused(step)
            self._check_replaced()
        if self.setattr_original is not None and step >= self.check_steps:
            self._stop_replace_watch()

    def after_step(self, step: int, optimizer: Any) -> dict[str, Any] | None:
        if not self.active:
            return None
        if not self.setup_sent:
            self._send_setup()
        fields = None
        if self.models:
            fields = {"micro": self.micro, "syncs": self.syncs}
            if self.local_s is not None:
                fields["local_ms"] = round(self.local_s * 1e3, 3)
            bypass = self._bypassing(optimizer)
            if (not self.syncs or self.tail_unsynced) and self.unsynced_sent < self.max_unsynced:
                # A step whose gradients no DDP all-reduce touched: this rank applies its own gradient only.
                self.unsynced_sent += 1
                extra = {"bypass": bypass["site"], "bypass_module": bypass["module"]} if bypass else {}
                if self.micro and self.nosync_site:
                    extra["no_sync"] = self.nosync_site
                self.emit("ddp-unsynced-step", at_step=step, micro=self.micro, syncs=self.syncs,
                          site=self.backward_site, **extra)
            self._foreign(optimizer, step)
            if self.bypass_hooks and self.session.step >= self.bypass_steps:
                self._stop_bypass_watch()
            if self.local_patched and self.session.step >= self.local_steps:
                self._stop_local_watch()
        if self.data_reads:
            self._check_data_writes()
        if step == self.next_checksum:
            self.next_checksum = step * 2 if step < 64 else step + 64
            checksum = _checksum(optimizer, self.foreign_ids | self.written_ids)
            if checksum is not None:
                fields = {**(fields or {}), "checksum": checksum}
        self._reset_step()
        return fields

    def _watch_unwrap(self, ddp_class: Any) -> None:
        """The first `ddp.module` the user's code reads (a trainer that keeps the inner model and never calls the
        wrapper): where it was taken. DDP's own reads are library frames; the watch ends after it or after
        `unwrap_watch_reads` reads, restoring the class as it was."""
        import sys

        from torchdoctor.probes.userframes import is_library_file

        probe = self
        owned = "__getattr__" in vars(ddp_class)
        original = ddp_class.__getattr__
        left = [int(self.options.get("unwrap_watch_reads", 256))]
        # every distinct user line that reads `.module` (up to 4), not only the first: a parameter count or a
        # print before the loop reads it harmlessly, and the read that trains around the wrapper comes later
        sites: set[tuple[str, int]] = set()

        def stop() -> None:
            if owned:
                ddp_class.__getattr__ = original
            elif "__getattr__" in vars(ddp_class):
                del ddp_class.__getattr__

        def __getattr__(ddp: Any, name: str) -> Any:  # noqa: N807 - the method it wraps
            if name == "module":
                left[0] -= 1
                frame = sys._getframe(1)
                key = (frame.f_code.co_filename, frame.f_lineno)
                if key not in sites and not is_library_file(key[0]):
                    # and the user line that called the reading function: a getter (`self._get_model()`) hands
                    # the inner model to the line that trains with it, which the analysis may name instead
                    sites.add(key)
                    back = frame.f_back
                    caller = ({"path": back.f_code.co_filename, "line": back.f_lineno,
                               "function": back.f_code.co_name}
                              if back is not None and not is_library_file(back.f_code.co_filename) else None)
                    probe.emit("ddp-unwrapped", site={"path": key[0], "line": key[1],
                                                      "function": frame.f_code.co_name}, caller=caller,
                               at_step=probe.session.step + 1)
                    if len(sites) >= 4:
                        left[0] = 0
                if left[0] <= 0:
                    stop()
            return original(ddp, name)

        ddp_class.__getattr__ = transparent(__getattr__)

    # -- forwards outside every DDP wrapper ---------------------------------------------------

    def _start_bypass_watch(self) -> None:
        from torch.nn.modules import module as module_mod

        self.bypass_hooks = [module_mod.register_module_forward_pre_hook(self._outside_pre),
                             module_mod.register_module_forward_hook(self._outside_post, always_call=True)]

    def _stop_bypass_watch(self) -> None:
        for handle in self.bypass_hooks:
            handle.remove()
        self.bypass_hooks = []
        self.outside_depth = 0

    def _outside_pre(self, module: Any, args: Any) -> None:
        if self.outside_depth:
            self.outside_depth += 1
            return
        if self.ddp_depth or not torch.is_grad_enabled() or isinstance(module, self.ddp_class):
            return
        self.outside_depth = 1
        if len(self.outside) >= 4:
            return
        ids = [id(p) for p in module.parameters() if p.requires_grad]
        if not ids:
            return
        frames = self.user_frames(sys._getframe(1))
        if not frames:
            return
        frame = _chooser(frames, module)
        site = {"path": frame.f_code.co_filename, "line": frame.f_lineno, "function": frame.f_code.co_name}
        if frame is not frames[0]:
            site["passes"] = True  # this line hands the module to the code that calls it
        self.outside.append({"module": type(module).__name__, "ids": ids, "site": site})

    def _outside_post(self, module: Any, args: Any, output: Any) -> None:
        if self.outside_depth:
            self.outside_depth -= 1

    def _bypassing(self, optimizer: Any) -> dict[str, Any] | None:
        """With no DDP forward this step: the first forward outside every wrapper that ran a DDP model's
        parameters the optimizer steps (the model trained around its wrapper), else None."""
        if self.micro or not self.outside:
            return None
        stepped = _stepped_ids(optimizer)
        for call in self.outside:
            if any(i in self.ddp_params and i in stepped for i in call["ids"]):
                return call
        return None

    def _foreign(self, optimizer: Any, step: int) -> None:
        """Once: a forward outside every wrapper whose trainable parameters belong to no DDP model and are stepped
        by the optimizer (a loss module with its own weights, a head kept apart): their gradients stay local."""
        if self.foreign_sent or not self.outside:
            return
        stepped = _stepped_ids(optimizer)
        for call in self.outside:
            foreign = [i for i in call["ids"] if i not in self.ddp_params and i in stepped]
            if foreign:
                self.foreign_sent = True
                self.foreign_ids = set(foreign)
                self.emit("ddp-foreign-forward", at_step=step, module=call["module"], parameters=len(foreign),
                          site=call["site"])
                return

    def _backward(self, tensors: Any) -> None:
        """While no all-reduce happened this step (and events are still wanted): where this backward runs."""
        if (not self.syncs or self.tail_unsynced) and self.unsynced_sent < self.max_unsynced and self.models \
                and self.session.step < 64:
            from torchdoctor.probes.sites import here
            self.backward_site = here()

    def _send_setup(self) -> None:
        self.setup_sent = True
        dist = torch.distributed
        if not (dist.is_available() and dist.is_initialized()):
            return
        self.emit("ddp-setup", backend=str(dist.get_backend()), world_size=dist.get_world_size(),
                  group_rank=dist.get_rank(), ddp_models=len(self.models))

    # -- DistributedSampler -----------------------------------------------------------

    def _wrap_sampler(self) -> None:
        from torch.utils.data.distributed import DistributedSampler

        probe = self
        original_iter = DistributedSampler.__iter__
        original_set_epoch = DistributedSampler.set_epoch

        @functools.wraps(original_iter)
        def __iter__(sampler):  # noqa: N807 - the method it wraps
            probe._sampler_pass(sampler)
            return original_iter(sampler)

        @functools.wraps(original_set_epoch)
        def set_epoch(sampler, epoch):
            probe._sampler_state(sampler)["set_epoch_calls"] += 1
            return original_set_epoch(sampler, epoch)

        DistributedSampler.__iter__ = transparent(__iter__)
        DistributedSampler.set_epoch = transparent(set_epoch)

    def _sampler_state(self, sampler: Any) -> dict[str, Any]:
        state = self.samplers.get(sampler)
        if state is None:
            state = {"id": len(self.samplers) + 1, "passes": 0, "set_epoch_calls": 0}
            try:
                self.samplers[sampler] = state
            except TypeError:
                pass
        return state

    def _sampler_pass(self, sampler: Any) -> None:
        state = self._sampler_state(sampler)
        state["passes"] += 1
        if state["passes"] > self.max_events:
            return
        self.emit("sampler-pass", sampler=state["id"], passes=state["passes"], epoch=getattr(sampler, "epoch", None),
                  shuffle=bool(getattr(sampler, "shuffle", False)), set_epoch_calls=state["set_epoch_calls"],
                  **self._site())

    # -- DistributedDataParallel --------------------------------------------------------

    def _wrap_ddp(self) -> None:
        from torch.nn.parallel import DistributedDataParallel

        probe = self
        original_init = DistributedDataParallel.__init__
        original_forward = DistributedDataParallel.forward

        @functools.wraps(original_init)
        def __init__(ddp, *args, **kwargs):  # noqa: N807
            original_init(ddp, *args, **kwargs)
            probe._ddp_created(ddp)

        self.ddp_class = DistributedDataParallel

        @functools.wraps(original_forward)
        def forward(ddp, *args, **kwargs):
            if torch.is_grad_enabled():
                probe.micro += 1
                if ddp.require_backward_grad_sync:
                    probe.syncs += 1
                    probe.tail_unsynced = False
                else:
                    probe.tail_unsynced = True  # this micro-step's gradient reaches no all-reduce unless one follows
                if not probe.forward_site_sent:
                    probe._forward_site()
            probe.ddp_depth += 1
            try:
                if probe.expand_left > 0 or (probe.write_watch and probe.session.step < probe.bypass_steps):
                    out = probe._watched_forward(original_forward, ddp, args, kwargs)
                else:
                    out = original_forward(ddp, *args, **kwargs)
            finally:
                probe.ddp_depth -= 1
            if probe.local_s is None:
                probe.local_s = time.perf_counter() - probe.step_end
            return out

        original_no_sync = DistributedDataParallel.no_sync

        @functools.wraps(original_no_sync)
        def no_sync(ddp, *args, **kwargs):
            # where the script turns synchronisation off (a helper may choose the context): named when a step's
            # last micro-step ran without an all-reduce; a dict of the user's line per call, nothing more
            if probe.unsynced_sent < probe.max_unsynced:
                probe.nosync_site = _caller_site(sys._getframe(1))
            return original_no_sync(ddp, *args, **kwargs)

        owned_setattr = "__setattr__" in vars(DistributedDataParallel)
        original_setattr = DistributedDataParallel.__setattr__

        def __setattr__(ddp, name, value):  # noqa: N807 - the method it wraps
            if name == "require_backward_grad_sync" and not value and probe.unsynced_sent < probe.max_unsynced:
                # the script's own `model.require_backward_grad_sync = ...` (no_sync() sets it from torch's
                # file, and its call was noted above): a helper may assign it, far from the backward
                site = _caller_site(sys._getframe(1), depth=1)
                if site is not None:
                    probe.nosync_site = {**site, "flag": True}
            original_setattr(ddp, name, value)

        DistributedDataParallel.__init__ = transparent(__init__)
        DistributedDataParallel.forward = transparent(forward)
        DistributedDataParallel.no_sync = transparent(no_sync)
        if not owned_setattr:
            DistributedDataParallel.__setattr__ = transparent(__setattr__)
        transparent(type(self)._watched_forward)  # it calls the original forward for the first few

    def _ddp_created(self, ddp: Any) -> None:
        if not self.models:
            self._watch_unwrap(type(ddp))
            self._start_replace_watch()
            if self.session.step < self.bypass_steps:
                self._start_bypass_watch()
        self.models.append(weakref.ref(ddp))
        module = ddp.module
        self.ddp_params.update(id(p) for p in module.parameters())
        if self.local_steps > self.session.step:
            self.local_params.update((id(p), (n, p)) for n, p in module.named_parameters() if p.requires_grad)
            if not self.local_patched:
                self._start_local_watch()
        self.emit(
            "ddp-model",
            model=len(self.models),
            module=type(module).__name__,
            find_unused_parameters=bool(getattr(ddp, "find_unused_parameters", False)),
            static_graph=bool(getattr(ddp, "static_graph", False)),
            gradient_as_bucket_view=bool(getattr(ddp, "gradient_as_bucket_view", False)),
            parameters=sum(1 for p in module.parameters() if p.requires_grad),
            **self._site(),
        )

    def _forward_site(self) -> None:
        self.forward_site_sent = True
        self.emit("ddp-forward", **self._site())

    def _check_unused(self, step: int) -> None:
        for number, ref in enumerate(self.models, 1):
            ddp = ref()
            if ddp is None:
                continue
            unused = [n for n, p in ddp.module.named_parameters() if p.requires_grad and p.grad is None]
            if not unused:
                continue
            self.emit(
                "ddp-unused",
                model=number,
                parameters=unused[:50],
                count=len(unused),
                find_unused_parameters=bool(getattr(ddp, "find_unused_parameters", False)),
                static_graph=bool(getattr(ddp, "static_graph", False)),
                **_owner_forward(ddp.module, unused[0]),
            )

    def _start_replace_watch(self) -> None:
        from torchdoctor.probes.patches import user_site
        from torchdoctor.probes.sites import as_dict

        probe = self
        module_class = torch.nn.Module
        parameter_class = torch.nn.Parameter
        original = module_class.__setattr__
        self.setattr_original = original

        def __setattr__(module: Any, name: str, value: Any) -> None:  # noqa: N807 - the method it wraps
            if isinstance(value, parameter_class) and len(probe.assigned) < 64:
                site = user_site(sys._getframe(1))
                if site is not None:
                    probe.assigned[id(value)] = {**(as_dict(site) or {}), "name": name}
            original(module, name, value)

        __setattr__.__wrapped__ = original  # type: ignore[attr-defined]
        module_class.__setattr__ = transparent(__setattr__)

    def _stop_replace_watch(self) -> None:
        if self.setattr_original is not None and "__setattr__" in vars(torch.nn.Module):
            torch.nn.Module.__setattr__ = self.setattr_original
        self.setattr_original = None
        self.assigned.clear()

    def _check_replaced(self) -> None:
        """Parameters of a DDP model that are not the ones DDP registered its gradient hooks on."""
        for number, ref in enumerate(self.models, 1):
            ddp = ref()
            registered = getattr(ddp, "_module_parameters", None)
            if ddp is None or registered is None or number in self.replaced_sent:
                continue
            known = {id(p) for p in registered}
            replaced = [(n, p) for n, p in ddp.module.named_parameters() if p.requires_grad and id(p) not in known]
            if not replaced:
                continue
            self.replaced_sent.add(number)
            site = next((self.assigned[id(p)] for _, p in replaced if id(p) in self.assigned), None)
            self.emit("ddp-replaced-parameter", model=number, parameters=[n for n, _ in replaced][:50],
                      count=len(replaced), site=site)

    def _watched_forward(self, forward: Any, ddp: Any, args: tuple, kwargs: dict) -> Any:
        """A DDP forward under a TorchFunctionMode that notes .expand() of the model's parameters (the first
        forward) and in-place writes to them (`p.data.add_(...)`, a `no_grad` `p.copy_(...)`: the forwards of
        the first `bypass_watch_steps` steps, until one is found)."""
        from torch.overrides import TorchFunctionMode

        expand = self.expand_left > 0
        self.expand_left -= 1
        named = [(n, p) for n, p in ddp.module.named_parameters()]
        names = {id(p): n for n, p in named}
        storage: dict[int, tuple[str, Any]] = {}
        compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)()
        if self.write_watch and not self.written_ids and not compiling and \
                getattr(ddp.module, "_orig_mod", None) is None:  # a compiled forward would recompile without it
            for n, p in named:
                if p.requires_grad and p.device.type != "meta":
                    storage.setdefault(p.data_ptr(), (n, p))
        probe = self
        watched = (torch.Tensor.expand, torch.Tensor.expand_as)
        stepping = [False]

        class ParameterWatch(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                if args and isinstance(args[0], torch.Tensor):
                    if expand and func in watched and id(args[0]) in names:
                        probe._expanded(names[id(args[0])], args[0])
                    elif storage and not stepping[0] and getattr(func, "__name__", "").endswith("_") and not \
                            getattr(func, "__name__", "").startswith("_"):
                        hit = storage.get(args[0].data_ptr())
                        if hit is not None and args[0].shape == hit[1].shape:
                            probe._written(hit[0], hit[1], func.__name__)
                            storage.clear()
                return func(*args, **(kwargs or {}))

        if not expand and not storage:
            return forward(ddp, *args, **kwargs)
        handles = []
        if storage:
            # an optimizer stepped inside the forward (Lightning's manual optimization) writes the parameters too
            from torch.optim.optimizer import (
                register_optimizer_step_post_hook,
                register_optimizer_step_pre_hook,
            )

            handles = [register_optimizer_step_pre_hook(lambda *a: stepping.__setitem__(0, True)),
                       register_optimizer_step_post_hook(lambda *a: stepping.__setitem__(0, False))]
        try:
            with ParameterWatch():
                return forward(ddp, *args, **kwargs)
        finally:
            for handle in handles:
                handle.remove()

    def _start_local_watch(self) -> None:
        probe = self

        def method(name: str, original: Any) -> Any:
            def wrapper(tensor: Any, *args: Any, **kwargs: Any) -> Any:
                if id(tensor) in probe.local_params:
                    probe._local_write(tensor, None, name, sys._getframe(1))
                return original(tensor, *args, **kwargs)

            return transparent(wrapper)

        def foreach(name: str, original: Any) -> Any:
            def wrapper(tensors: Any, *args: Any, **kwargs: Any) -> Any:
                probe._local_foreach(tensors, name, sys._getframe(1))
                return original(tensors, *args, **kwargs)

            return transparent(wrapper)

        parameter = torch.nn.Parameter
        base = torch._C.TensorBase.__dict__.get("data")
        if base is not None and "data" not in parameter.__dict__:
            def get_data(param: Any) -> Any:
                alias = base.__get__(param)
                if id(param) in probe.local_params and not probe.ddp_depth:
                    probe._data_read(param, alias, sys._getframe(1))
                return alias

            def set_data(param: Any, value: Any) -> None:
                base.__set__(param, value)
                if id(param) in probe.local_params and not probe.ddp_depth:
                    frame = sys._getframe(1)
                    if not _optimizer_code(frame):
                        probe._local_write(param, None, "data =", frame)

            self.local_patched.append((parameter, "data", False, None))
            parameter.data = property(transparent(get_data), transparent(set_data))
        for name in LOCAL_WRITE_METHODS:
            original = getattr(torch.Tensor, name, None)
            if original is None:
                continue
            own = name in parameter.__dict__
            self.local_patched.append((parameter, name, own, parameter.__dict__.get(name)))
            setattr(parameter, name, method(name, getattr(parameter, name)))
        for name in LOCAL_WRITE_FOREACH:
            original = getattr(torch, name, None)
            if original is None:
                continue
            self.local_patched.append((torch, name, True, original))
            setattr(torch, name, foreach(name, original))

    def _stop_local_watch(self) -> None:
        self._check_data_writes()
        for owner, name, own, original in reversed(self.local_patched):
            if own:
                setattr(owner, name, original)
            else:
                delattr(owner, name)
        self.local_patched = []
        self.local_params = {}
        if self.local_sites:
            self.emit("ddp-local-writes", steps=self.session.step,
                      sites=[{**v["site"], "count": v["count"]} for v in self.local_sites.values()])

    def _data_read(self, param: Any, alias: Any, frame: Any) -> None:
        """An alias `p.data` taken by the script outside the optimizer and the DDP forward: kept until the step's
        end with its version counter (at most 64 a step; the write, if any, is seen then)."""
        if len(self.data_reads) >= 64 or _optimizer_code(frame):
            return
        frames = self.user_frames(frame)
        if not frames:
            return
        user = frames[0]
        site = {"path": user.f_code.co_filename, "line": user.f_lineno, "function": user.f_code.co_name}
        self.data_reads.append((alias, alias._version, param, site))

    def _check_data_writes(self) -> None:
        reads, self.data_reads = self.data_reads, []
        for alias, version, param, site in reads:
            if alias._version != version:
                self._note_write(param, None, "data", site)

    def _local_foreach(self, tensors: Any, op: str, frame: Any) -> None:
        if not isinstance(tensors, (list, tuple)) or not tensors or _optimizer_code(frame):
            return
        # zeroing gradients is a reset, not an update
        grads = {} if op == "_foreach_zero_" else \
            {id(p.grad): (n, p) for n, p in self.local_params.values() if p.grad is not None}
        for t in tensors[:256]:
            if id(t) in self.local_params:
                self._local_write(t, None, op, frame)
                return
            if id(t) in grads:
                self._local_write(grads[id(t)][1], "grad", op, frame)
                return

    def _local_write(self, param: Any, part: str | None, op: str, frame: Any) -> None:
        """An in-place write to a DDP model's parameter (or its gradient) from the script, outside the optimizer's
        update and the DDP forward (whose writes the forward watch notes): the first time per user line."""
        if self.ddp_depth or _optimizer_code(frame):
            return
        frames = self.user_frames(frame)
        if not frames:
            return
        user = frames[0]
        self._note_write(param, part, op, {"path": user.f_code.co_filename, "line": user.f_lineno,
                                           "function": user.f_code.co_name})

    def _note_write(self, param: Any, part: str | None, op: str, site: dict[str, Any]) -> None:
        key = (site["path"], site["line"])
        seen = self.local_sites.get(key)
        if seen is not None:
            seen["count"] += 1
            return
        if len(self.local_sites) >= 16:
            return
        name = self.local_params.get(id(param), (None,))[0]
        self.local_sites[key] = {"site": site, "count": 1}
        if part is None:
            self.written_ids.add(id(param))  # the written parameter joins the checksum
        self.emit("ddp-local-write", parameter=name, part=part or "data", op=op, at_step=self.session.step + 1,
                  site=site)

    def _written(self, name: str, param: Any, op: str) -> None:
        """A parameter of a DDP model written in place inside its forward: once, with the user's line."""
        frames = self.user_frames(sys._getframe(2))
        if not frames:
            return
        self.written_ids.add(id(param))
        frame = frames[0]
        self.emit("ddp-parameter-write", parameter=name, op=op,
                  site={"path": frame.f_code.co_filename, "line": frame.f_lineno,
                        "function": frame.f_code.co_name})

    def _expanded(self, name: str, param: Any) -> None:
        self.expands += 1
        if self.expands <= self.max_events:
            self.emit("ddp-expand", parameter=name, shape=list(param.shape), **self._site())

    def finish(self, reason: str) -> None:
        if getattr(self, "local_patched", None):
            self._stop_local_watch()

    # -- torch.save ---------------------------------------------------------------------

    def _wrap_save(self) -> None:
        probe = self
        original_save = torch.save

        @functools.wraps(original_save)
        def save(obj, f, *args, **kwargs):
            probe._saved(f)
            return original_save(obj, f, *args, **kwargs)

        torch.save = transparent(save)

    def _saved(self, f: Any) -> None:
        if not isinstance(f, (str, os.PathLike)):
            return  # a buffer or an open file: not a checkpoint path
        self.saves += 1
        if self.saves <= self.max_events:
            self.emit("save", file=os.fspath(f), **self._site())

    # -- helpers ------------------------------------------------------------------------

    def _site(self) -> dict[str, Any]:
        """The deepest user frame calling into the wrapped API: path, line, function."""
        frames = self.user_frames()
        if not frames:
            return {}
        frame = frames[0]
        return {"path": frame.f_code.co_filename, "line": frame.f_lineno, "function": frame.f_code.co_name}


def _caller_site(frame: Any, depth: int = 8) -> dict[str, Any] | None:
    """The first user frame among the `depth` nearest callers (a wrapper such as accelerate's no_sync sits between):
    a bounded walk, cheap enough for a call made every micro-step."""
    while frame is not None and depth > 0:
        path = frame.f_code.co_filename
        if not is_library_file(path):
            return {"path": path, "line": frame.f_lineno, "function": frame.f_code.co_name}
        frame = frame.f_back
        depth -= 1
    return None


def _owner_forward(module: Any, parameter: str) -> dict[str, Any]:
    """Where the module holding `parameter` is (or is not) called: its parent's forward."""
    import inspect

    parts = parameter.split(".")[:-1]
    owner = module
    for part in parts[:-1]:
        owner = getattr(owner, part, owner)
    forward = type(owner).forward
    try:
        path = inspect.getsourcefile(forward)
        _, line = inspect.getsourcelines(forward)
    except (OSError, TypeError):
        return {}
    return {"path": path, "line": line, "function": f"{type(owner).__name__}.forward"}


def _chooser(frames: list[Any], module: Any) -> Any:
    """The user frame that chose the module called around the wrapper: while the calling function received it as
    one of its own arguments (`self._compute_loss(unwrapped_model, inputs)` hands it to a helper that runs the
    forward), its caller passed it down, so the walk goes up to the first frame where it is not a parameter (a
    local taken from `unwrap_model`, an attribute, a global). That frame's line is the call to fix."""
    for i, frame in enumerate(frames):
        code = frame.f_code
        nparams = code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & 0x04) + bool(code.co_flags & 0x08)
        params = code.co_varnames[:nparams]
        held = [name for name in params if frame.f_locals.get(name) is module]
        if not held or i + 1 == len(frames) or frame.f_back is not frames[i + 1]:
            return frame  # (a library frame between them: the argument came from a framework, not the script)
    return frames[0]


# In-place writes a script makes to a parameter outside its optimizer (nn.Parameter methods), and the foreach
# functions that write lists of parameters or gradients in place (clip_grad_norm_ scales the gradients with one).
LOCAL_WRITE_METHODS = ("add_", "sub_", "mul_", "div_", "copy_", "clamp_", "clamp_min_", "clamp_max_", "fill_",
                       "zero_", "normal_", "uniform_", "masked_fill_", "index_fill_", "index_copy_", "lerp_",
                       "addcmul_", "addcdiv_", "__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__")
LOCAL_WRITE_FOREACH = ("_foreach_mul_", "_foreach_div_", "_foreach_add_", "_foreach_sub_", "_foreach_copy_",
                       "_foreach_zero_", "_foreach_clamp_max_", "_foreach_clamp_min_", "_foreach_lerp_")
_OPTIMIZER_DIRS = (os.sep + os.path.join("torch", "optim") + os.sep,
                   os.sep + os.path.join("torch", "nn", "parallel") + os.sep,
                   os.sep + os.path.join("torch", "distributed") + os.sep)


def _optimizer_code(frame: Any, depth: int = 12) -> bool:
    """The write comes from an optimizer's own update or DDP's machinery (torch.optim, torch.nn.parallel,
    torch.distributed): not the script's. Only the frames below the first user frame count; torchdoctor's own
    wrappers (the amp probe's around clip_grad_norm_) are passed through like any library frame."""
    while frame is not None and depth > 0:
        path = frame.f_code.co_filename
        if any(d in path for d in _OPTIMIZER_DIRS):
            return True
        if not is_library_file(path) and not in_torchdoctor(path):
            return False
        frame = frame.f_back
        depth -= 1
    return False


CHECKSUM_PARAMETERS = 8


def _stepped_ids(optimizer: Any) -> set[int]:
    groups = getattr(optimizer, "param_groups", None) or []
    return {id(p) for group in groups for p in group.get("params", [])}


def _checksum(optimizer: Any, foreign: set[int] | frozenset[int] = frozenset()) -> float | None:
    """The sum of the first 1024 values of up to `CHECKSUM_PARAMETERS` of the optimizer's parameters, evenly
    spaced from the first to the last (and of those that belong to no DDP model or that the script wrote
    outside the optimizer: `foreign`), in float64: identical on every rank while DDP keeps the replicas in step
    (one host transfer on a GPU, on sampled steps only). The first and last alone miss a drift confined to a
    middle layer (a dead-unit reset, a QK-clip of the attention weights)."""
    try:
        params = [p for g in optimizer.param_groups for p in g["params"]]
        if not params:
            return None
        n = len(params)
        spaced = [params[round(i * (n - 1) / (CHECKSUM_PARAMETERS - 1))] for i in range(CHECKSUM_PARAMETERS)] \
            if n > CHECKSUM_PARAMETERS else params
        outside = [p for p in params if id(p) in foreign][:4]
        picked = {id(p): p for p in (*spaced, *outside)}.values()
        with torch.no_grad():
            total = torch.stack([p.detach().reshape(-1)[:1024].double().sum() for p in picked]).sum()
        return float(total)
    except Exception:  # noqa: BLE001 - a sharded or meta parameter: no checksum
        return None


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default
