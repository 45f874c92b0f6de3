"""The checkpoint probe: what each torch.save holds, how each torch.load and load_state_dict went.

Measures
--------
- every `torch.save` (wrapped): what the object holds — model weights (a
  mapping of tensors, or a key like `model`/`state_dict`), optimizer state
  (`state` + `param_groups`), scheduler state (`last_epoch`, `base_lrs`),
  GradScaler state (`scale`, `growth_factor`), epoch/step counters, RNG
  states (`torch.get_rng_state()`, `random.getstate()`, numpy's) — read two
  levels deep without copying anything; whether a whole `nn.Module` (or
  optimizer) object is pickled; `module.` / `_orig_mod.` key prefixes; the
  optimizer step it was written at; what a resume of this run would need
  (the optimizer, a scheduler and an enabled GradScaler when the script
  built one — their constructors are wrapped to know);
- every `torch.load` (wrapped): `weights_only` and `map_location` as passed,
  what the loaded object holds, and the devices its tensors landed on;
- `nn.Module.load_state_dict` (wrapped): strict, the missing and
  unexpected keys it returned (and the prefix that explains them), and the
  `load_state_dict` of optimizers, schedulers and scalers — what a resume
  restored.

Costs: nothing per training step; a save or load costs a walk over the
saved object's top two levels (microseconds next to the disk write).

Symptoms (thresholds in rules/data/thresholds.toml, [checkpoint];
classified in doctor/analysis/checkpoint.py)
-----------------------------------------------------------------------
- checkpoint-incomplete: a checkpoint written while training went on
  (or holding more than the weights) lacks a part a resume needs;
- whole-model-pickled: an nn.Module object was saved;
- wrapped-state-dict-saved: saved weights named `module.…` / `_orig_mod.…`;
- state-dict-mismatch: `load_state_dict(strict=False)` returned missing or
  unexpected keys;
- unsafe-load: `torch.load(weights_only=False)`, or a load without
  `map_location` whose tensors landed on another GPU than this process's.
"""

from __future__ import annotations

import os
import random
import re
import sys
import weakref
from collections.abc import Mapping
from typing import Any

from torchdoctor.probes.base import Probe
from torchdoctor.probes.importwatch import when_imported
from torchdoctor.probes.patches import subclasses_of
from torchdoctor.probes.scalers import scaler_watch
from torchdoctor.probes.sites import here, outside_own_init
from torchdoctor.probes.transparent import transparent
from torchdoctor.probes.userframes import in_torchdoctor, is_library_file

PREFIXES = ("module.", "_orig_mod.")
POSITION_KEYS = ("epoch", "step", "global_step", "iteration", "iter", "steps", "epochs", "batch_idx", "it")
RNG_WORDS = ("rng", "random", "generator", "seed_state")
# A path that names the training position (Hugging Face's checkpoint-500/, Lightning's epoch=2-step=12.ckpt)
POSITION_IN_NAME = re.compile(r"(?:checkpoint|ckpt|step|epoch|iter|iteration)[-_=]?\d+", re.IGNORECASE)


class CheckpointProbe(Probe):
    name = "checkpoint"

    def install(self) -> None:
        import torch
        from torch.amp import grad_scaler
        from torch.optim import lr_scheduler

        self.torch = torch
        self.max_events = int(self.options.get("max_events", 40))
        self.events = 0
        self.saves = 0
        self.loads = 0
        self.schedulers: weakref.WeakSet = weakref.WeakSet()
        self.scalers = scaler_watch(torch)
        self.optimizer_types = (torch.optim.Optimizer,)
        self._inside = 0
        self._save, self._load = torch.save, torch.load
        torch.save = self._wrap_save(torch.save)
        torch.load = self._wrap_load(torch.load)
        # safetensors' file functions (its save_model / load_model go through them): weights written and read
        # without torch.save / torch.load are the same checkpoint facts
        when_imported("safetensors.torch", self._wrap_safetensors)
        module = torch.nn.Module
        module.load_state_dict = self._wrap_module_load(module.load_state_dict)
        torch.optim.Optimizer.load_state_dict = self._wrap_restore(torch.optim.Optimizer.load_state_dict, "optimizer")
        scheduler_classes = [lr_scheduler.LRScheduler, *subclasses_of(lr_scheduler.LRScheduler)]
        for cls in scheduler_classes:
            if "load_state_dict" in cls.__dict__:
                cls.load_state_dict = self._wrap_restore(cls.__dict__["load_state_dict"], "scheduler")
            if "__init__" in cls.__dict__:
                cls.__init__ = self._wrap_init(cls.__dict__["__init__"], self.schedulers)
        scaler = grad_scaler.GradScaler
        scaler.load_state_dict = self._wrap_restore(scaler.load_state_dict, "scaler")
        # A resume that leaves the stepping optimizer empty: optimizers restored with state (and the user's stack
        # there), optimizers built after such a restore (with their stack), and loaded files holding optimizer
        # state next to weights a model then took; judged once, at the first optimizer step.
        self.restored: list[tuple[weakref.ref, str, list[tuple[str, int, str, Any]]]] = []
        self.built_after: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.replaced_in_place: set[int] = set()  # optimizers built where a restored one was in a local variable
        self.loaded_optimizer_state: dict[str, Any] | None = None  # the first load holding optimizer state
        self.model_restore_site: dict[str, Any] | None = None
        self.model_restore_stack: list[tuple[str, int, str, Any]] = []
        # an optimizer whose load_state_dict ran but left it with no per-parameter state (a state dict filtered
        # through the fresh optimizer's own, empty, state_dict()): (weakref, the call's site)
        self.loaded_empty: tuple[weakref.ref, dict[str, Any] | None] | None = None
        # the file the weights came from before training, when it held no optimizer state (a checkpoint that never
        # saved one), and whether any optimizer's load_state_dict ran: a resume from such a file starts empty
        self.weights_load: dict[str, Any] | None = None
        # the first file read before training that held no optimizer state (a resume's RNG or trainer-state file, the
        # weights): when no optimizer state is restored at all, the analysis asks whether the run writes that file
        # again, next to optimizer state, in the same checkpoint layout
        self.first_load: dict[str, Any] | None = None
        self.optimizer_loads = 0
        self.resume_checked = False
        # Schedulers after a resume: where each was built, and which were restored (and where)
        self.scheduler_sites: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.restored_schedulers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        # GradScalers restored before training: (weakref, the script's restore line)
        self.restored_scalers: list[tuple[weakref.ref, dict[str, Any] | None]] = []
        torch.optim.Optimizer.__init__ = self._wrap_optimizer_init(torch.optim.Optimizer.__init__)
        # A resume inside the run (a later job in the same process, after a first one trained and saved): the loads
        # read since the last optimizer step once training began, and the weights restore that follows them, judged
        # at the next optimizer step of any optimizer through a one-shot global step hook
        self.mid_loads: list[dict[str, Any]] = []
        self.mid_resume: dict[str, Any] | None = None
        self.mid_resumes = 0
        self._mid_hook: Any = None
        self.early_loads: list[dict[str, Any]] = []  # what each file read before training held
        self.read_files: set[tuple[str | None, str]] = set()  # (folder, name) of the files torch.load read
        # the first weights read before training, as fingerprints (a few tensors' shape, sum and first value): weights
        # that reached the model without nn.Module.load_state_dict are found in its parameters at the first step
        self.early_weights: dict[str, Any] | None = None

    def _emit(self, kind: str, **fields: Any) -> None:
        if self.events < self.max_events:
            self.events += 1
            self.emit(kind, **fields)

    def _guard(self, fn: Any, *args: Any) -> None:
        if not self.enabled:
            return
        try:
            fn(*args)
        except Exception as exc:  # noqa: BLE001 - never reaches the script
            self.enabled = False
            self.emit("probe-error", where=getattr(fn, "__name__", "checkpoint"),
                      error=f"{type(exc).__name__}: {exc}"[:500])

    # -- what a run has, to resume ---------------------------------------------------------------

    def _wrap_init(self, original: Any, into: weakref.WeakSet) -> Any:
        probe = self

        def __init__(obj: Any, *args: Any, **kwargs: Any) -> None:
            original(obj, *args, **kwargs)
            try:
                into.add(obj)
                if obj not in probe.scheduler_sites:  # the outermost construction: the script's line
                    probe.scheduler_sites[obj] = here(outside_own_init(sys._getframe(1), obj))
            except Exception:  # noqa: BLE001 - an unhashable scheduler, an odd frame: never the script's problem
                pass

        __init__.__wrapped__ = original  # type: ignore[attr-defined]
        __init__.__doc__ = original.__doc__
        return transparent(__init__)

    def _needed(self) -> list[str]:
        needed = ["model", "optimizer"]
        if len(self.schedulers):
            needed.append("scheduler")
        if self.scalers.enabled():
            needed.append("scaler")
        needed.append("epoch")
        return needed

    # -- torch.save --------------------------------------------------------------------------------

    def _wrap_save(self, original: Any) -> Any:
        probe = self

        def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
            # A module saved whole (torch.save(model)) is pickled with its hook dictionaries: the probes' hooks
            # (bound to probes that hold the run's mapped files) must not be in them, nor in the file.
            kept = _without_our_hooks(obj, probe.torch)
            try:
                result = original(obj, f, *args, **kwargs)
            finally:
                for registry, items in kept:
                    registry.clear()
                    registry.update(items)
            if probe._inside == 0:
                probe._guard(probe._saved, obj, f)
            return result

        save.__wrapped__ = original  # type: ignore[attr-defined]
        save.__doc__ = original.__doc__
        return transparent(save)

    def _saved(self, obj: Any, f: Any) -> None:
        self.saves += 1
        described = self._describe(obj)
        if isinstance(f, (str, os.PathLike)) and POSITION_IN_NAME.search(os.fspath(f)) and (
                "step" not in described["holds"]):
            described["holds"].append("step")  # checkpoint-500/optimizer.pt: the path says where to resume
        described.update(
            file=_file_name(f) or _buffer_target(),
            site=_composing_site(obj) or here(),
            at_step=self.step,
            needed=self._needed(),
            index=self.saves,
        )
        folder = _folder(f)
        if folder is not None:
            described["dir"] = folder
        self._emit("save", **described)

    def _describe(self, obj: Any, depth: int = 0) -> dict[str, Any]:
        """What a saved or loaded object holds: {'holds': [...], 'type': ..., 'modules': [...], 'prefix': ...}."""
        torch = self.torch
        out: dict[str, Any] = {"type": type(obj).__name__, "holds": [], "modules": [], "keys": []}
        holds: list[str] = out["holds"]

        def add(what: str) -> None:
            if what not in holds:
                holds.append(what)

        if isinstance(obj, torch.nn.Module):
            add("model")
            out["modules"].append(type(obj).__name__)
            return out
        if isinstance(obj, self.optimizer_types):
            add("optimizer")
            out["modules"].append(type(obj).__name__)
            return out
        if not isinstance(obj, Mapping):
            if _is_rng_state(obj, torch):
                add("rng")
            return out
        keys = list(obj.keys())[:200]
        out["keys"] = [str(k) for k in keys[:30]]
        kind = _mapping_kind(obj, torch)
        if kind:
            add(kind)
            if kind == "model":
                out["prefix"] = _prefix(keys)
                out["tensors"] = len(obj)
            return out
        weights = _weights_among(obj, keys, torch)
        if weights:
            # a model's state_dict with a few extras put in it (Pytorch-UNet's `state_dict['mask_values'] = ...`):
            # the weights, and the extras read like a checkpoint's other entries
            add("model")
            out["prefix"] = _prefix(weights)
            out["tensors"] = len(weights)
            named = set(weights)
            keys = [k for k in keys if k not in named]
        for key in keys:
            value = obj[key]
            name = str(key).lower()
            if isinstance(value, torch.nn.Module):
                add("model")
                out["modules"].append(f"{key}: {type(value).__name__}")
                continue
            if isinstance(value, self.optimizer_types):
                add("optimizer")
                out["modules"].append(f"{key}: {type(value).__name__}")
                continue
            sub = _mapping_kind(value, torch) if isinstance(value, Mapping) else None
            if sub:
                add(sub)
                if sub == "model" and "prefix" not in out:
                    out["prefix"] = _prefix(list(value.keys())[:200])
                continue
            if isinstance(value, (int, float)) and not isinstance(value, bool) and any(
                name == w or name.endswith("_" + w) or name.startswith(w + "_") for w in POSITION_KEYS
            ):
                add("step" if "step" in name or "iter" in name or name == "it" else "epoch")
                continue
            if any(w in name for w in RNG_WORDS) or _is_rng_state(value, torch):
                add("rng")
                continue
            if name in ("scheduler", "lr_scheduler", "sched") and isinstance(value, Mapping):
                add("scheduler")
                continue
            if isinstance(value, (list, tuple)):
                # Lightning's layout: `optimizer_states` and `lr_schedulers` are lists of state dicts (one per
                # optimizer / scheduler; an empty list when the module configured none)
                found = {_mapping_kind(v, torch) for v in value[:4] if isinstance(v, Mapping)} - {None}
                if not found and any(w in name for w in ("optimizer", "scheduler")):
                    found = {"optimizer" if "optimizer" in name else "scheduler"}
                for what in sorted(found):
                    add(what)  # type: ignore[arg-type]
                if found:
                    continue
            if isinstance(value, Mapping) and depth == 0:
                inner = self._describe(value, depth + 1)
                for what in inner["holds"]:
                    add(what)
                out["modules"] += inner["modules"]
                if inner.get("prefix") and "prefix" not in out:
                    out["prefix"] = inner["prefix"]
        return out

    def _wrap_safetensors(self, module: Any) -> None:
        probe = self
        save_file, load_file = getattr(module, "save_file", None), getattr(module, "load_file", None)
        if not callable(save_file) or not callable(load_file):
            return

        def save(tensors: Any, filename: Any, *args: Any, **kwargs: Any) -> Any:
            result = save_file(tensors, filename, *args, **kwargs)
            if probe._inside == 0:
                probe._guard(probe._saved, tensors, filename)
            return result

        def load(filename: Any, *args: Any, **kwargs: Any) -> Any:
            probe._inside += 1
            try:
                result = load_file(filename, *args, **kwargs)
            finally:
                probe._inside -= 1
            if probe._inside == 0:
                # a safetensors file holds tensors only: never an unpickling load
                device = kwargs.get("device", args[0] if args else None)
                probe._guard(probe._loaded, result, filename, (), {"weights_only": True, "map_location": device})
            return result

        for wrapper, original in ((save, save_file), (load, load_file)):
            wrapper.__wrapped__ = original  # type: ignore[attr-defined]
            wrapper.__doc__ = original.__doc__
            wrapper.__name__ = original.__name__
        module.save_file, module.load_file = transparent(save), transparent(load)

    # -- torch.load --------------------------------------------------------------------------------

    def _wrap_load(self, original: Any) -> Any:
        probe = self

        def load(f: Any, *args: Any, **kwargs: Any) -> Any:
            probe._inside += 1
            try:
                result = original(f, *args, **kwargs)
            finally:
                probe._inside -= 1
            if probe._inside == 0:
                probe._guard(probe._loaded, result, f, args, kwargs)
            return result

        load.__wrapped__ = original  # type: ignore[attr-defined]
        load.__doc__ = original.__doc__
        return transparent(load)

    def _loaded(self, result: Any, f: Any, args: Any, kwargs: Any) -> None:
        self.loads += 1
        map_location = kwargs.get("map_location", args[0] if args else None)
        described = self._describe(result)
        devices = sorted(_devices(result, self.torch))
        current = None
        torch = self.torch
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            current = f"cuda:{torch.cuda.current_device()}"
        described.update(
            file=_file_name(f) or _buffer_target(),
            site=here(),
            at_step=self.step,
            weights_only=kwargs.get("weights_only"),
            map_location=None if map_location is None else str(map_location)[:80],
            devices=devices,
            current_device=current,
            local_rank=int(os.environ.get("LOCAL_RANK", 0)),
        )
        folder = _folder(f)
        if folder is not None:
            described["dir"] = folder
        self._emit("load", **described)
        if len(self.read_files) < 64:
            self.read_files.add((folder, described["file"]))
        prints = _fingerprints(result, torch) if "model" in described["holds"] else []
        if self.step:
            # read after training began: kept until the next optimizer step, for a weights restore that follows it
            self.mid_loads = [m for m in self.mid_loads if m["at"] == self.step][-7:]
            self.mid_loads.append({"file": described["file"], "dir": folder, "site": described["site"],
                                   "holds": list(described["holds"]), "at": self.step,
                                   "entries": _optimizer_state_entries(result), "prints": prints})
            if _holds_module(result, torch):
                self._arm_mid_resume(described["site"], _user_stack())
            elif prints:
                # weights that may reach the model another way (copied into its parameters, a model class's own
                # load_state_dict): judged at the next step only if the parameters then hold them
                self._arm_mid_resume(described["site"], _user_stack(), copied=True)
        if self.model_restore_site is None and not self.step and _holds_module(result, torch):
            # a pickled nn.Module taken back whole (`model = torch.load(path)["model"]`) restores the weights as
            # load_state_dict does: the same resume judgements apply
            self.model_restore_site = described["site"]
            self.model_restore_stack = _user_stack()
        if not self.step and len(self.early_loads) < 8:
            self.early_loads.append({"holds": list(described["holds"])})
        if prints and not self.step and self.early_weights is None:
            self.early_weights = {"site": described["site"], "prints": prints}
        if self.first_load is None and "optimizer" not in described["holds"] and not self.step:
            self.first_load = {"file": described["file"], "dir": folder, "site": described["site"],
                               "holds": list(described["holds"])}
        if "model" in described["holds"] and "optimizer" not in described["holds"] and not self.step:
            self.weights_load = {"file": described["file"], "dir": folder, "site": described["site"],
                                 "position": "epoch" in described["holds"] or "step" in described["holds"]}
        if "optimizer" in described["holds"] and self.loaded_optimizer_state is None and (
                "model" in described["holds"] or not self.step):
            # the weights and the optimizer in one file, or the optimizer's own file read before training starts
            # (a checkpoint saved as several files): state a resume must hand to the optimizer that steps
            self.loaded_optimizer_state = {"site": described["site"], "file": described["file"],
                                           "with_model": "model" in described["holds"],
                                           "entries": _optimizer_state_entries(result)}

    # -- load_state_dict ---------------------------------------------------------------------------

    def _wrap_module_load(self, original: Any) -> Any:
        probe = self

        def load_state_dict(module: Any, state_dict: Any, strict: bool = True, *args: Any, **kwargs: Any) -> Any:
            outer = probe._inside == 0
            probe._inside += 1
            try:
                result = original(module, state_dict, strict, *args, **kwargs)
            finally:
                probe._inside -= 1
            if outer:
                probe._guard(probe._module_loaded, module, state_dict, strict, result)
            return result

        load_state_dict.__wrapped__ = original  # type: ignore[attr-defined]
        load_state_dict.__doc__ = original.__doc__
        return transparent(load_state_dict)

    def _module_loaded(self, module: Any, state_dict: Any, strict: bool, result: Any) -> None:
        missing = list(getattr(result, "missing_keys", []) or [])
        unexpected = list(getattr(result, "unexpected_keys", []) or [])
        total = len(state_dict) if isinstance(state_dict, Mapping) else None
        if self.model_restore_site is None and not self.step:
            self.model_restore_site = here()  # weights restored before training (the optimizer's file may come next)
            self.model_restore_stack = _user_stack()
        elif self.step:
            self._arm_mid_resume(here(), _user_stack())
        self._emit(
            "load-state-dict",
            what="model",
            model=type(module).__name__,
            strict=bool(strict),
            missing_keys=missing[:10],
            unexpected_keys=unexpected[:10],
            missing=len(missing),
            unexpected=len(unexpected),
            keys=total,
            model_keys=len(module.state_dict()) if missing or unexpected else total,
            prefix=_explaining_prefix(missing, unexpected),
            site=here(),
            at_step=self.step,
        )

    def _wrap_restore(self, original: Any, what: str) -> Any:
        probe = self

        def load_state_dict(obj: Any, *args: Any, **kwargs: Any) -> Any:
            outer = probe._inside == 0
            probe._inside += 1
            try:
                result = original(obj, *args, **kwargs)
            finally:
                probe._inside -= 1
            if outer:
                probe._guard(probe._restored, what, obj)
            return result

        load_state_dict.__wrapped__ = original  # type: ignore[attr-defined]
        load_state_dict.__doc__ = original.__doc__
        return transparent(load_state_dict)

    def _restored(self, what: str, obj: Any) -> None:
        site = here()
        if what == "optimizer" and not getattr(obj, "state", None) and _library_caller(sys._getframe(1)):
            # a library putting an optimizer's own, still empty, state back (accelerate's prepare() moves it to the
            # device through state_dict()/load_state_dict()): no state came from anywhere, so no restore
            self._emit("load-state-dict", what=what, type=type(obj).__name__, site=site, at_step=self.step,
                       reload=True)
            return
        self._emit("load-state-dict", what=what, type=type(obj).__name__, site=site, at_step=self.step)
        if what == "optimizer":
            self.optimizer_loads += 1
        if what == "scheduler":
            try:
                # the script's call, above the scheduler class's own override calling super().load_state_dict
                self.restored_schedulers[obj] = here(_outside_own_methods(sys._getframe(1), obj))
                # a SequentialLR / ChainedScheduler restores its children's state itself (no load_state_dict of theirs)
                for child in list(getattr(obj, "_schedulers", None) or [])[:16]:
                    self.restored_schedulers[child] = site
            except TypeError:
                pass
        if what == "scaler" and not self.step and len(self.restored_scalers) < 8:
            self.restored_scalers.append((weakref.ref(obj), site))
        if what == "optimizer" and getattr(obj, "state", None) and len(self.restored) < 8:
            self.restored.append((weakref.ref(obj), type(obj).__name__, _user_stack()))
        elif what == "optimizer" and not getattr(obj, "state", None) and self.loaded_empty is None and not self.step:
            self.loaded_empty = (weakref.ref(obj), site)

    def _wrap_optimizer_init(self, original: Any) -> Any:
        probe = self

        def __init__(optimizer: Any, *args: Any, **kwargs: Any) -> None:
            original(optimizer, *args, **kwargs)
            # only once a restore happened (an optimizer's, or the weights next to a checkpoint's optimizer state)
            restoring = probe.restored or (probe.model_restore_site is not None
                                           and probe.loaded_optimizer_state is not None)
            if restoring and not probe.resume_checked:
                try:
                    probe.built_after[optimizer] = _user_stack()
                except TypeError:
                    pass
                else:
                    # built in a function that was handed the restored optimizer (a training loop given
                    # `optimizer` that builds its own from its class): that line throws the restored state away
                    if probe.restored and probe._holds_restored(sys._getframe(1)):
                        probe.replaced_in_place.add(id(optimizer))

        __init__.__wrapped__ = original  # type: ignore[attr-defined]
        __init__.__doc__ = original.__doc__
        return transparent(__init__)

    def _holds_restored(self, frame: Any) -> bool:
        """Whether the user's frame that built an optimizer holds, in a local variable, one the script restored."""
        from torchdoctor.probes.userframes import is_library_file

        while frame is not None and is_library_file(frame.f_code.co_filename):
            frame = frame.f_back
        if frame is None or frame.f_code.co_name == "<module>":
            return False  # module level: the script's own variables, not a function handed the optimizer
        restored = [ref() for ref, _, _ in self.restored]
        return any(value is r for value in list(frame.f_locals.values())[:64] for r in restored if r is not None)

    def before_step(self, step: int, optimizer: Any) -> None:
        if self.resume_checked:
            return
        self.resume_checked = True
        self.session.stop_calling(self, "before_step")  # the resume is judged at the first step only
        self._check_scaler(step)
        if self.model_restore_site is None and self.early_weights is not None and _holds_prints(
                optimizer, self.early_weights["prints"], self.torch):
            # the weights read before training are in the stepping parameters, put there without load_state_dict
            self.model_restore_site = self.early_weights["site"]
        if getattr(optimizer, "state", None):
            # the stepping optimizer holds state: restored (a resume), or nothing to judge. After a resume, the
            # schedules that drive it must go on from where they were too
            restored = [stack for ref, _, stack in self.restored if ref() is optimizer]
            if restored:
                self._check_schedulers(optimizer, restored[-1], step)
            return
        # a restored optimizer that is gone (garbage once replaced) is not the stepping one either
        restored = [(kind, stack) for ref, kind, stack in self.restored if ref() is not optimizer]
        if restored:
            kind, stack = restored[-1]
            built = self.built_after.get(optimizer)
            if id(optimizer) in self.replaced_in_place:
                built_site = _as_site(built or [])
            else:
                built_site = _as_site(_shared_call(stack, built) or (built or []))
            self._emit("resume-optimizer-empty", how="replaced", restored_type=kind,
                       stepping_type=type(optimizer).__name__, restored_site=_as_site(stack),
                       built_site=built_site, at_step=step)
        elif self.loaded_optimizer_state is not None and self.model_restore_site is not None:
            empty = self.loaded_empty
            if empty is not None and empty[0]() is optimizer:
                # its load_state_dict did run, with no per-parameter state in what it was handed: say so, and where
                if self.loaded_optimizer_state.get("entries") != 0:  # 0: written before any step, nothing lost
                    self._emit("resume-optimizer-empty", how="loaded-empty", stepping_type=type(optimizer).__name__,
                               load_site=self.loaded_optimizer_state.get("site"),
                               file=self.loaded_optimizer_state.get("file"), restore_site=empty[1],
                               entries=self.loaded_optimizer_state.get("entries"),
                               model_site=self.model_restore_site, at_step=step)
                return
            # the optimizer that steps was built after the weights were restored (a trainer's train() that builds
            # its own after load() restored the weights): where it was built is where the state was not handed on
            # Only there: a framework's configure_optimizers builds a fresh one by design (the fix is at the restore)
            built_site = _as_site(_sibling_call(self.model_restore_stack, self.built_after.get(optimizer)) or [])
            self._emit("resume-optimizer-empty", how="never-loaded", stepping_type=type(optimizer).__name__,
                       load_site=self.loaded_optimizer_state.get("site"), file=self.loaded_optimizer_state.get("file"),
                       model_site=self.model_restore_site, at_step=step, built_site=built_site,
                       own_file=not self.loaded_optimizer_state.get("with_model"),
                       model_caller_site=_as_site(self.model_restore_stack[:-1]))
        elif self.weights_load is not None and self.model_restore_site is not None and not self.optimizer_loads:
            # the weights came back from a file that holds no optimizer state, and no optimizer's state was loaded
            # from anywhere: a fine-tune from pretrained weights, or a resume from a checkpoint that never saved
            # the optimizer. The analysis tells them apart by the run's own saves (it writes that file again).
            self._emit("resume-optimizer-empty", how="not-saved", stepping_type=type(optimizer).__name__,
                       load_site=self.weights_load["site"], file=self.weights_load["file"],
                       dir=self.weights_load["dir"], position=self.weights_load["position"] or any(
                           {"epoch", "step"} & set(m["holds"]) for m in self.early_loads),
                       unread_optimizer=_unread_optimizer_file(self.weights_load["dir"], self.read_files),
                       model_site=self.model_restore_site, at_step=step)
        elif self.first_load is not None and not self.optimizer_loads and self.loaded_optimizer_state is None:
            # something was read before training and no optimizer state came back from anywhere: a fresh start that
            # reads a config or a vocabulary, or a resume whose restore left the state out (accelerate's load_state
            # called before prepare() registered anything). The analysis tells them apart by the run's own saves.
            load = self.first_load
            self._emit("resume-optimizer-empty", how="unrestored", stepping_type=type(optimizer).__name__,
                       load_site=load["site"], file=load["file"], dir=load["dir"], holds=load["holds"],
                       model_site=self.model_restore_site, at_step=step)

    # -- a resume inside the run ---------------------------------------------------------------------

    def _arm_mid_resume(self, site: dict[str, Any] | None, stack: list[Any], copied: bool = False) -> None:
        """Weights restored after training began from a file read since the last optimizer step (not a copy from
        another model, as a DQN's target network takes): the next optimizer step is a resume's first. `copied`: only
        weights read, no restore seen (yet): a resume only if the stepping parameters hold them then."""
        loads = [m for m in self.mid_loads if m["at"] == self.step]
        pending = self.mid_resume is not None and not self.mid_resume["judged"]
        if pending and not copied and self.mid_resume.get("copied") and self.mid_resume["at"] == self.step:
            self.mid_resume.update(site=site, stack=stack, copied=False)  # the restore of the weights just read
            return
        if not loads or pending or self.mid_resumes >= 4:
            return
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        self.mid_resumes += 1
        self.mid_resume = {"site": site, "stack": stack, "loads": loads, "at": self.step, "judged": False,
                           "optimizer_loads": self.optimizer_loads, "saves": self.saves, "copied": copied}
        self._mid_hook = register_optimizer_step_pre_hook(self._mid_step)

    def _mid_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        hook, self._mid_hook = self._mid_hook, None
        if hook is not None:
            hook.remove()
        self._guard(self._judge_mid_resume, optimizer)

    def _judge_mid_resume(self, optimizer: Any) -> None:
        """The first optimizer step after a resume inside the run: the same judgements as at a run's first step,
        on what that resume read (the optimizer state in its file, or none saved anywhere)."""
        resume = self.mid_resume
        if resume is None or resume["judged"]:
            return
        resume["judged"] = True
        if getattr(optimizer, "state", None) or self.optimizer_loads > resume["optimizer_loads"]:
            return  # it goes on with state (restored, or the one that trained before), or a restore ran
        loads = [m for m in self.mid_loads if m["at"] == resume["at"]] or resume["loads"]
        if resume["copied"] and not any(_holds_prints(optimizer, m.get("prints") or [], self.torch) for m in loads):
            return  # the weights read went elsewhere (a teacher, an evaluation copy): no resume of this optimizer
        common = {"stepping_type": type(optimizer).__name__, "model_site": resume["site"], "at_step": self.step,
                  "mid_run": True, "saves_before": resume["saves"],
                  "model_caller_site": _as_site((resume["stack"] or [])[:-1])}
        with_state = [m for m in loads if "optimizer" in m["holds"]]
        if with_state:
            load = with_state[0]
            if load.get("entries") == 0:
                return  # written before its optimizer's first step: nothing to lose
            built = _sibling_call(resume["stack"], self.built_after.get(optimizer))
            self._emit("resume-optimizer-empty", how="never-loaded", load_site=load["site"], file=load["file"],
                       built_site=_as_site(built or []), own_file="model" not in load["holds"], **common)
            return
        weights = [m for m in loads if "model" in m["holds"]] or loads
        load = weights[-1]
        self._emit("resume-optimizer-empty", how="not-saved", load_site=load["site"], file=load["file"],
                   dir=load["dir"], position=any({"epoch", "step"} & set(m["holds"]) for m in loads),
                   unread_optimizer=_unread_optimizer_file(load["dir"], self.read_files), **common)

    def _check_schedulers(self, optimizer: Any, restore_stack: list[Any], step: int) -> None:
        """After a resume whose optimizer state was restored: a scheduler on that optimizer that was restored
        but drives another optimizer through a scheduler it holds (a nested one pickled with its own optimizer
        and put back by load_state_dict), or one never restored whose count starts at zero (kept for `finish`:
        a later step(epoch) may still position it)."""
        from torch.optim.lr_scheduler import LRScheduler

        restore_site = _as_site(restore_stack)
        for sched in list(self.schedulers)[:16]:
            if getattr(sched, "optimizer", None) is not optimizer or type(sched).__name__ == "ReduceLROnPlateau":
                continue
            if sched in self.restored_schedulers:
                for name, value in list(vars(sched).items())[:64]:
                    if isinstance(value, LRScheduler) and getattr(value, "optimizer", None) is not optimizer:
                        self._emit("resume-scheduler", how="stale", scheduler_type=type(sched).__name__,
                                   inner=name, inner_type=type(value).__name__,
                                   restore_site=self.restored_schedulers.get(sched),
                                   built_site=self.scheduler_sites.get(sched), at_step=step)
                        return
            elif getattr(sched, "last_epoch", 1) <= 0:
                # its count starts at zero while the optimizer goes on; the analysis checks, with the schedule
                # probe's record of this scheduler, that no step(epoch) positioned it later and that it stepped
                self._emit("resume-scheduler", how="fresh", scheduler_type=type(sched).__name__,
                           built_site=self.scheduler_sites.get(sched), restore_site=restore_site,
                           restored_type=type(optimizer).__name__, at_step=step)
                return

    def _check_scaler(self, step: int) -> None:
        """A GradScaler restored before training that is not the one stepping the first optimizer step: a new
        scaler built after the restore (a trainer's setup that builds its own) starts from its initial scale, and
        the restored state is lost."""
        stepping = self.scalers.stepping
        if stepping is None or not self.restored_scalers or not getattr(stepping, "_enabled", False):
            return
        if any(ref() is stepping for ref, _ in self.restored_scalers):
            return
        _, site = self.restored_scalers[-1]
        self._emit("resume-scaler", how="replaced", restore_site=site, built_site=self.scalers.sites.get(stepping),
                   scale=float(getattr(stepping, "_init_scale", 0.0) or 0.0), at_step=step)

    def finish(self, reason: str) -> None:
        self.emit("checkpoint-summary", saves=self.saves, loads=self.loads, needed=self._needed())


OPTIMIZER_FILE = re.compile(r"optim", re.IGNORECASE)
STATE_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".tar", ".pkl", ".safetensors")


def _unread_optimizer_file(folder: str | None, read: set[tuple[str | None, str]]) -> str | None:
    """A file beside the weights, named for the optimizer's state (optimizer.pt, optim_states.pth), that no
    torch.load of this run read: a checkpoint folder whose optimizer part the resume left behind. One listing of
    the folder, at most 200 names."""
    if not folder:
        return None
    try:
        with os.scandir(folder) as entries:
            names = [e.name for _, e in zip(range(200), entries, strict=False)]
    except OSError:
        return None
    for name in sorted(names):
        if OPTIMIZER_FILE.search(name) and name.lower().endswith(STATE_SUFFIXES) and (folder, name) not in read:
            return name
    return None


def _fingerprints(obj: Any, torch: Any, limit: int = 4) -> list[tuple[tuple[int, ...], float, float]]:
    """(shape, sum, first value) of a few floating, non-constant tensors of the weights a loaded object holds
    (itself, or a value one level down): enough to find them again in a model's parameters without keeping them."""
    candidates = [obj] + (list(obj.values())[:64] if isinstance(obj, Mapping) else [])
    for value in candidates:
        if not isinstance(value, Mapping):
            continue
        tensors = [v for v in list(value.values())[:64] if isinstance(v, torch.Tensor) and v.is_floating_point()
                   and 2 <= v.numel() <= 4_000_000 and v.device.type != "meta"]
        if len(tensors) < 2:
            continue
        prints = []
        with torch.no_grad():
            for t in tensors:
                total, first = float(t.double().sum()), float(t.reshape(-1)[0])
                # a constant tensor (a LayerNorm's ones, a zero bias) is what any fresh model holds too: no print
                if abs(total - first * t.numel()) > 1e-6 * t.numel():
                    prints.append((tuple(t.shape), total, first))
                if len(prints) >= limit:
                    break
        return prints
    return []


def _holds_prints(optimizer: Any, prints: list[tuple[tuple[int, ...], float, float]], torch: Any) -> bool:
    """Whether a parameter of the optimizer holds one of the fingerprinted tensors (the same shape, sum and first
    value). Reads at most 64 parameters, only those of a fingerprinted shape; never fails."""
    if not prints:
        return False
    shapes = {p[0] for p in prints}
    try:
        params = [p for g in optimizer.param_groups for p in g["params"]][:64]
        with torch.no_grad():
            for param in params:
                if tuple(param.shape) in shapes and param.device.type != "meta":
                    found = (tuple(param.shape), float(param.double().sum()), float(param.reshape(-1)[0]))
                    if found in prints:
                        return True
    except Exception:  # noqa: BLE001 - a sharded or odd parameter: no match
        return False
    return False


def _library_caller(frame: Any) -> bool:
    """Whether the code that called a load_state_dict (past torchdoctor's wrappers and torch's own frames) is a
    library's, not the script's."""
    while frame is not None and (in_torchdoctor(frame.f_code.co_filename)
                                 or _in_torch(frame.f_code.co_filename)):
        frame = frame.f_back
    return frame is not None and is_library_file(frame.f_code.co_filename)


def _in_torch(path: str) -> bool:
    return f"{os.sep}torch{os.sep}" in path


def _holds_module(obj: Any, torch: Any) -> bool:
    """Whether a loaded object is an nn.Module or a mapping with one among its first values."""
    if isinstance(obj, torch.nn.Module):
        return True
    return isinstance(obj, Mapping) and any(isinstance(v, torch.nn.Module) for v in list(obj.values())[:64])


def _outside_own_methods(frame: Any, obj: Any, depth: int = 12) -> Any:
    """The frame that called a method of `obj`: above the frames of `obj`'s own methods (a scheduler class of the
    script's whose load_state_dict calls super().load_state_dict is not where the script restores it)."""
    found = current = frame
    for _ in range(depth):
        if current is None:
            break
        if current.f_locals.get("self") is obj:
            found = current.f_back
        current = current.f_back
    return found


def _optimizer_state_entries(obj: Any) -> int | None:
    """How many parameters' state the optimizer state dict in a loaded object holds (itself, or a value one level
    down): 0 for a checkpoint written before the optimizer's first step; None when no such dict is found there."""
    values = [obj] + (list(obj.values())[:64] if isinstance(obj, Mapping) else [])
    for value in values:
        if isinstance(value, Mapping) and {"state", "param_groups"} <= set(list(value.keys())[:200]):
            state = value.get("state")
            return len(state) if isinstance(state, Mapping) else None
    return None


def _user_stack(limit: int = 24) -> list[tuple[str, int, str, Any]]:
    """The user's frames here, outermost first: (path, line, function, code object)."""
    from torchdoctor.probes.userframes import is_library_file

    out = []
    frame = sys._getframe(2)
    while frame is not None and len(out) < limit:
        code = frame.f_code
        if not is_library_file(code.co_filename):
            out.append((code.co_filename, frame.f_lineno, code.co_name, code))
        frame = frame.f_back
    return list(reversed(out))


def _shared_call(restore: list[Any], built: list[Any] | None) -> list[Any] | None:
    """Where the optimizer that steps was built, seen from the function that restored the other one: the frame
    of the construction's stack in that function (`set_parameters(...)` called after `load_state_dict`)."""
    if not built:
        return None
    functions = {frame[3] for frame in restore}
    for frame in reversed(built):
        if frame[3] in functions:
            return [frame]
    return None


def _sibling_call(restore: list[Any], built: list[Any] | None) -> list[Any] | None:
    """The frame of the construction's stack in a method of a class whose other method restored the weights
    (`Trainer.train` building the optimizer after `Trainer.load` restored the model): the line that builds it
    afresh instead of the factory it calls."""
    if not built:
        return None
    classes = {q.rpartition(".")[0] for q in (getattr(f[3], "co_qualname", "") for f in restore)
               if "." in q and "<locals>" not in q}
    for frame in reversed(built):
        qualname = getattr(frame[3], "co_qualname", "")
        if "." in qualname and qualname.rpartition(".")[0] in classes:
            return [frame]
    return None


def _as_site(stack: list[Any]) -> dict[str, Any] | None:
    if not stack:
        return None
    path, line, function, _ = stack[-1]
    return {"path": path, "line": line, "function": function}


def _mapping_kind(value: Mapping, torch: Any) -> str | None:
    """A state dict's kind from its keys: model weights, optimizer, scheduler, scaler."""
    keys = set(list(value.keys())[:200])
    if {"state", "param_groups"} <= keys:
        return "optimizer"
    if "scale" in keys and ("growth_factor" in keys or "_growth_tracker" in keys):
        return "scaler"
    if "last_epoch" in keys and ("base_lrs" in keys or "_step_count" in keys):
        return "scheduler"
    values = list(value.values())[:50]
    if values and all(isinstance(v, torch.Tensor) for v in values) and all(isinstance(k, str) for k in keys):
        # weights: named tensors with dotted names or parameter-like ones
        if any("." in k or k.endswith(("weight", "bias")) for k in keys):
            return "model"
    return None


def _weights_among(value: Mapping, keys: list[Any], torch: Any) -> list[str]:
    """The keys of the named parameter tensors of a mapping that is mostly one model's weights (more than half of
    its entries, two or more) with a few other entries beside them; [] otherwise."""
    named = [k for k in keys if isinstance(k, str) and isinstance(value[k], torch.Tensor)
             and ("." in k or k.endswith(("weight", "bias")))]
    return named if len(named) >= 2 and 2 * len(named) > len(keys) else []


def _prefix(keys: list[Any]) -> str | None:
    names = [k for k in keys if isinstance(k, str)]
    for prefix in PREFIXES:
        if names and all(k.startswith(prefix) for k in names):
            return prefix
    return None


def _explaining_prefix(missing: list[str], unexpected: list[str]) -> str | None:
    """'module.' when the unexpected keys are the missing ones with that prefix (or the reverse)."""
    if not missing or not unexpected:
        return None
    miss = set(missing)
    for prefix in PREFIXES:
        if all(k.startswith(prefix) and k[len(prefix):] in miss for k in unexpected[:50]):
            return prefix
        if all(k.startswith(prefix) for k in missing[:50]) and all(prefix + k in miss for k in unexpected[:50]):
            return prefix
    return None


def _is_rng_state(value: Any, torch: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value.dtype == torch.uint8 and value.dim() == 1 and value.numel() >= 5000
    if isinstance(value, tuple) and len(value) == 3 and isinstance(value[1], tuple) and len(value[1]) == 625:
        return True  # random.getstate()
    if isinstance(value, tuple) and value and value[0] == "MT19937":
        return True  # numpy.random.get_state()
    if isinstance(value, Mapping) and value.get("bit_generator") is not None:
        return True  # numpy Generator.bit_generator.state
    return value is random


def _devices(obj: Any, torch: Any, limit: int = 64) -> set[str]:
    found: set[str] = set()
    stack = [obj]
    seen = 0
    while stack and seen < limit:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            found.add(str(item.device))
            seen += 1
        elif isinstance(item, Mapping):
            stack.extend(list(item.values())[:limit])
        elif isinstance(item, (list, tuple)):
            stack.extend(list(item)[:limit])
    return found


def _folder(f: Any) -> str | None:
    """The absolute directory of the file a save or load used (to tell a run's own checkpoint from another's)."""
    name = os.fspath(f) if isinstance(f, (str, os.PathLike)) else getattr(f, "name", None)
    if not isinstance(name, str):
        return None
    try:
        return os.path.dirname(os.path.abspath(name))
    except (OSError, ValueError):
        return None


def _file_name(f: Any) -> str | None:
    """The base name of the file a save or load used; None for an in-memory buffer (io.BytesIO)."""
    if isinstance(f, (str, os.PathLike)):
        return os.path.basename(os.fspath(f))
    name = getattr(f, "name", None)
    return os.path.basename(name) if isinstance(name, str) else None


PATH_NAMES = ("filepath", "file_path", "path", "filename", "checkpoint_path", "ckpt_path", "save_path",
              "output_path", "output_dir", "dirpath")


def _buffer_target() -> str:
    """Where a save into a buffer is going: a path the callers hold in a local with a path-like name
    (Lightning saves into a BytesIO inside `_atomic_save(checkpoint, filepath)`, then writes it out)."""
    frame = sys._getframe(2)
    for _ in range(12):
        if frame is None:
            break
        for name in PATH_NAMES:
            value = frame.f_locals.get(name)
            if isinstance(value, (str, os.PathLike)) and os.fspath(value):
                return os.path.basename(os.fspath(value).rstrip("/"))
        frame = frame.f_back
    return "an in-memory buffer"


def _without_our_hooks(obj: Any, torch: Any) -> list[tuple[dict, list]]:
    """Remove the probes' hooks from the modules in `obj` (itself, or one level of a dict/list/tuple); returns
    each changed hook dictionary with its items as they were, to be put back in the same order."""
    from torchdoctor.probes.forwards import _is_ours
    from torchdoctor.probes.restore import _INSTANCE_HOOKS

    module_type = torch.nn.Module
    if isinstance(obj, module_type):
        roots = [obj]
    elif isinstance(obj, dict):
        roots = [v for v in list(obj.values())[:64] if isinstance(v, module_type)]
    elif isinstance(obj, (list, tuple)):
        roots = [v for v in obj[:64] if isinstance(v, module_type)]
    else:
        return []
    kept: list[tuple[dict, list]] = []
    for root in roots:
        for module in root.modules():
            state = getattr(module, "__dict__", {})
            for attr in _INSTANCE_HOOKS:
                registry = state.get(attr)
                if isinstance(registry, dict) and any(_is_ours(h) for h in registry.values()):
                    kept.append((registry, list(registry.items())))
                    for key in [k for k, h in registry.items() if _is_ours(h)]:
                        del registry[key]
    return kept


def _composing_site(obj: Any) -> dict[str, Any] | None:
    """The user's line that handed `obj` to torch.save, past helpers that only forward their `*args`/`**kwargs`
    (torchvision's, DETR's, DeiT's `save_on_master(*args, **kwargs)`): the checkpoint was put together where the
    forwarder was called, not in it. A helper that names the object (`def save_checkpoint(state, is_best)`) keeps
    its own torch.save line. None when there is no user frame."""
    frame = sys._getframe(1)
    while frame is not None and is_library_file(frame.f_code.co_filename):
        frame = frame.f_back
    for _ in range(4):
        if frame is None:
            return None
        caller = frame.f_back
        if caller is None or is_library_file(caller.f_code.co_filename) or not _forwarded(frame, obj):
            break
        frame = caller
    if frame is None:
        return None
    return {"path": frame.f_code.co_filename, "line": frame.f_lineno, "function": frame.f_code.co_name}


def _forwarded(frame: Any, obj: Any) -> bool:
    """Whether the frame's function received `obj` only through its `*args` or `**kwargs`."""
    code = frame.f_code
    named = code.co_argcount + code.co_kwonlyargcount
    values = frame.f_locals
    if any(values.get(name) is obj for name in code.co_varnames[:named]):
        return False
    index = named
    if code.co_flags & 0x04:  # CO_VARARGS
        if any(item is obj for item in values.get(code.co_varnames[index], ()) or ()):
            return True
        index += 1
    if code.co_flags & 0x08:  # CO_VARKEYWORDS
        extra = values.get(code.co_varnames[index]) or {}
        return any(item is obj for item in extra.values()) if isinstance(extra, dict) else False
    return False

