"""Who holds tensors across steps: a scan of the user's frames at the optimizer step.

At the optimizer post-hook the training loop's frame is on the stack. Its
locals (or the module's globals, for a loop at the top level of a script),
and the attributes of `self` in a method, are the places a step's results
survive into the next step. For each name that holds

- a tensor with an autograd graph: the graph's node count (bounded walk) and
  storage bytes — `total_loss += loss` shows up as a node count that grows
  every step while the bytes stay flat;
- a big tensor (≥ 1 MiB) without a graph: its bytes (`cache = cat([cache, x])`);
- an object of one of the script's own classes (a callback, a meter), or a short list of them: its
  attributes, one level down, as holders named `history.losses` (the analysis finds the line that grows
  them in that class); and, a few levels down, the meters a dict or registry keeps
  (`trainer.stats["train"]["loss"].sum`, `_aggregators["train"]["loss"].sum`, a class-level
  `metrics.meters[...]`): a running sum `self.sum += val * n` fed a loss tensor keeps every step's graph;
- a list / tuple / deque / dict of tensors, or of dicts of tensors or short
  tuples of them (one level down), or a dict of such lists: its length, and from a sample of elements at both ends an estimate of
  the tensors, graph-holding tensors and bytes it keeps (`history.append(out)`,
  `outputs.append({"loss": loss})`); for a small dict, the largest graph among
  its values (a dict of running sums, `totals[k] = totals.get(k, 0) + loss`).

Each record names the variable, its scope and the frame's file, function and
current line, so the parent can find the line that accumulates into it; the
other names the same holder goes by in other frames (a trainer's attribute
handed to a helper as a parameter) are kept as its `aliases`.
"""

from __future__ import annotations

import sys
import weakref
from collections import deque
from types import FrameType
from typing import Any

from torchdoctor.probes.census import MIB, TensorTypes, count_graph_nodes, storage_key_and_bytes
from torchdoctor.probes.userframes import is_library_file

BIG_TENSOR = MIB
MAX_OBJECTS = 8  # objects of the script's classes looked into per list (a trainer's callbacks)
MAX_ATTRIBUTES = 64  # attributes looked at per such object
MAX_ALIASES = 4  # other names one holder is recorded under
MAX_PAIR = 8  # a tuple element this short is a record (`(batch_size, loss)`), looked into
MAX_DEPTH = 4  # dicts / objects of the script's classes looked through to reach a holder (`stats["train"]["loss"].sum`)
MAX_NESTED = 48  # dict entries and objects looked into below the first level, per scan
_MARK = "torchdoctor.carried"


class _Marker:
    """Put in a graph root's metadata; weakly referenced, it dies with the node."""

    __slots__ = ("__weakref__",)

_CONTAINERS = (list, tuple, deque, dict)


class HolderScan:
    def __init__(self, is_tensor: TensorTypes, walk_limit: int, sample: int, top: int = 20):
        self.is_tensor = is_tensor
        self.walk_limit = walk_limit
        self.sample = sample
        self.top = top
        self._marks: dict[tuple, list[weakref.ref]] = {}  # the previous scan's graph roots, by holder
        self._own: dict[type, bool] = {}  # class -> defined in the script's own code
        self._class_file: dict[type, str] = {}

    def scan(self, frames: list[FrameType], owners: list[tuple[Any, dict[str, Any]]] = ()) -> list[dict[str, Any]]:
        """`owners`: objects whose attributes are scanned as `self.<name>` of the user's method named by its
        `where` (path, function, firstlineno, lineno) though no frame of it is on the stack — a framework's
        LightningModule or Trainer, whose training_step / compute_loss has returned by the optimizer step."""
        found: list[dict[str, Any]] = []
        walked: dict[int, tuple[int, bool]] = {}  # id(grad_fn) -> count, shared by holders in one scan
        seen_values: set[int] = set()
        self._by_id: dict[int, dict[str, Any]] = {}  # id(holder) -> its record, for the other names it goes by
        self._nested_left = MAX_NESTED
        for owner, where in owners:
            attrs = getattr(owner, "__dict__", None)
            if isinstance(attrs, dict):
                for name, value in list(attrs.items()):
                    self._consider(f"self.{name}", "attribute", value, dict(where), found, walked, seen_values)
        for frame in frames:
            code = frame.f_code
            at_module = code.co_name == "<module>"
            namespace = frame.f_globals if at_module else frame.f_locals
            where = {
                "path": code.co_filename,
                "function": code.co_name,
                "firstlineno": code.co_firstlineno,
                "lineno": frame.f_lineno,
            }
            for name, value in list(namespace.items()):
                if name.startswith("__"):
                    continue
                self._consider(name, "global" if at_module else "local", value, where, found, walked, seen_values)
            owner = None if at_module else namespace.get("self")
            attrs = getattr(owner, "__dict__", None) if owner is not None else None
            if isinstance(attrs, dict):
                for name, value in list(attrs.items()):
                    self._consider(f"self.{name}", "attribute", value, where, found, walked, seen_values)
        found.sort(key=lambda h: (-(h.get("graph_nodes") or 0), -(h.get("mib") or 0.0)))
        found = found[: self.top]
        self._mark_carried(found)
        return found

    def _mark_carried(self, found: list[dict[str, Any]]) -> None:
        """Whether each holder's graph from the previous scan is still alive: `carried` on the record.

        A graph that grows every step is a leak only when it survives the step (`total_loss += loss`,
        `losses.append(loss)`); a step's own graph that is bigger each step because the step does more (a
        REINFORCE episode that gets longer) dies with the step. Autograd nodes cannot be weakly referenced,
        so a small marker object goes into the root node's `metadata` dict and is weakly referenced: it
        lives exactly as long as the node.
        """
        marks: dict[tuple, list[weakref.ref]] = {}
        for record in found:
            roots = record.pop("_roots", None)
            if not roots:
                continue
            key = (record["name"], record.get("path"), record.get("function"))
            before = self._marks.get(key)
            if before:
                record["carried"] = any(ref() is not None for ref in before)
            refs = []
            for root in roots:
                try:
                    metadata = root.metadata
                    marker = metadata.get(_MARK)
                    if marker is None:
                        marker = metadata[_MARK] = _Marker()
                    refs.append(weakref.ref(marker))
                except (AttributeError, RuntimeError, TypeError):
                    continue
            if refs:
                marks[key] = refs
        self._marks = marks

    def _consider(self, name, scope, value, where, found, walked, seen_values, depth: int = 0) -> None:
        if id(value) in seen_values:
            # the same holder under another name (a trainer's `self.running` handed to a helper as `results`):
            # the analysis looks for the line that grows it under each name
            record = self._by_id.get(id(value))
            if record is not None and len(record.setdefault("aliases", [])) < MAX_ALIASES:
                record["aliases"].append({"name": name, "scope": scope, **where})
            return
        if self.is_tensor(value):
            record = self._tensor(value, walked)
        elif type(value) in _CONTAINERS and len(value) > 0:
            record = self._container(value, walked)
            if record is None and type(value) is dict:
                record = self._dict_of_lists(value, walked)
            if record is None and depth == 0 and type(value) in (list, tuple) and len(value) <= MAX_OBJECTS:
                # a few objects of the script's own classes (a trainer's callbacks): their attributes
                for i, item in enumerate(value):
                    self._inside(f"{name}[{i}]", item, where, found, walked, seen_values)
                return
        elif isinstance(value, dict) and len(value) > 0:
            # a dict subclass (an OrderedDict of meters): only looked through, never a holder itself (a
            # state_dict is an OrderedDict of tensors that do not grow)
            self._through(name, scope, value, where, found, walked, seen_values, depth)
            return
        else:
            if depth < MAX_DEPTH:
                self._inside(name, value, where, found, walked, seen_values, depth)
            return
        if record is None:
            if type(value) is dict:
                self._through(name, scope, value, where, found, walked, seen_values, depth)
            return
        seen_values.add(id(value))
        self._by_id[id(value)] = record
        record.update(name=name, scope=scope, **where)
        found.append(record)

    def _inside(self, name, value, where, found, walked, seen_values, depth: int = 0) -> None:
        """The attributes of an object of one of the script's own classes (a callback keeping `self.losses`),
        or of a class of the script used as a registry (`metrics.meters`); the class is where the analysis looks
        for the line that accumulates into them."""
        if isinstance(value, type):
            cls, attrs = value, {k: v for k, v in vars(value).items() if not k.startswith("__") and not callable(v)
                                 and not isinstance(v, (staticmethod, classmethod, property))}
            if not self._own_class(cls, as_class=True):
                return
        else:
            cls = type(value)
            if not self._own_class(cls):
                return
            attrs = getattr(value, "__dict__", None)
        if not isinstance(attrs, dict) or id(value) in seen_values:
            return
        if depth > 0:
            # below the first level only plain Python objects (meters, trackers): a model or an optimizer of the
            # script's class holds its parameters, which are no step's results
            torch = sys.modules.get("torch")
            if torch is not None and isinstance(value, (torch.nn.Module, torch.optim.Optimizer)):
                return
            if self._nested_left <= 0:
                return
            self._nested_left -= 1
        seen_values.add(id(value))
        for attr, item in list(attrs.items())[:MAX_ATTRIBUTES]:
            inner = {**where, "class_path": self._class_file.get(cls), "class_name": cls.__name__, "attribute": attr}
            self._consider(f"{name}.{attr}", "object", item, inner, found, walked, seen_values, depth=depth + 1)

    def _through(self, name, scope, box, where, found, walked, seen_values, depth: int) -> None:
        """A dict that holds no tensor itself: the dicts and objects of the script's classes among its first
        values, looked into (`stats["train"]` → the meters by name)."""
        if depth >= MAX_DEPTH or id(box) in seen_values:
            return
        seen_values.add(id(box))
        for key, item in list(box.items())[:MAX_OBJECTS * 2]:
            if self._nested_left <= 0:
                return
            if isinstance(item, dict) or self._own_class(type(item)):
                self._nested_left -= 1
                self._consider(f"{name}[{key!r}]", scope, item, where, found, walked, seen_values, depth=depth + 1)

    def _own_class(self, cls: type, as_class: bool = False) -> bool:
        """Whether `cls` is defined in the script's own code (`as_class`: the class itself is the value looked
        into, a registry class, rather than the type of an instance)."""
        known = self._own.get(cls)
        if known is None:
            module = sys.modules.get(getattr(cls, "__module__", "") or "")
            path = getattr(module, "__file__", None)
            known = bool(path) and not is_library_file(path) and not issubclass(cls, type)
            self._own[cls] = known
            if known:
                self._class_file[cls] = path
        if as_class and known:
            torch = sys.modules.get("torch")
            # a model or dataset class's class attributes are configuration, not a registry
            return not (torch is not None and issubclass(cls, (torch.nn.Module, torch.optim.Optimizer)))
        return known

    def _nodes(self, grad_fn: Any, walked: dict) -> tuple[int, bool]:
        key = id(grad_fn)
        if key not in walked:
            walked[key] = count_graph_nodes([grad_fn], self.walk_limit)
        return walked[key]

    def _tensor(self, t: Any, walked: dict) -> dict[str, Any] | None:
        grad_fn = getattr(t, "grad_fn", None)
        found = storage_key_and_bytes(t)
        nbytes = found[1] if found else 0
        if grad_fn is None and nbytes < BIG_TENSOR:
            return None
        record: dict[str, Any] = {"kind": "tensor", "mib": round(nbytes / MIB, 4), "shape": list(t.shape)}
        if grad_fn is not None:
            nodes, truncated = self._nodes(grad_fn, walked)
            record.update(graph_nodes=nodes, truncated=truncated, grad_fn=type(grad_fn).__name__, _roots=[grad_fn])
        return record

    def _container(self, box: Any, walked: dict) -> dict[str, Any] | None:
        values = box.values() if isinstance(box, dict) else box
        n = len(box)
        k = self.sample
        if n <= 2 * k:
            picked = list(values)
        elif isinstance(box, dict):
            items = list(values)
            picked = items[:k] + items[-k:]
        else:
            picked = [box[i] for i in range(k)] + [box[i] for i in range(n - k, n)]
        # Each element's tensors: the element itself, or the graph-holding tensor values of a dict element, one
        # level down (`outputs.append({"loss": loss, "metrics": ...})` keeps each step's loss and its graph).
        per_element = [[v] if self.is_tensor(v) else self._dict_tensors(v) for v in picked]
        tensors = [t for ts in per_element for t in ts]
        if not tensors:
            return None
        share = len(tensors) / len(picked)
        graph = [t for t in tensors if getattr(t, "grad_fn", None) is not None]
        sizes = [found[1] for found in map(storage_key_and_bytes, tensors) if found]
        mean_bytes = sum(sizes) / len(sizes) if sizes else 0.0
        record: dict[str, Any] = {
            "kind": type(box).__name__,
            "length": n,
            "tensors": round(share * n),
            "graph_tensors": round(len(graph) / len(picked) * n),
            "mib": round(share * n * mean_bytes / MIB, 4),
        }
        if any(ts and not self.is_tensor(v) for v, ts in zip(picked, per_element, strict=True)):
            record["in_dicts"] = True
        if graph:
            nodes, truncated = self._nodes(graph[-1].grad_fn, walked)  # the node, not the tensor
            record.update(graph_nodes_each=nodes, truncated=truncated, _roots=[t.grad_fn for t in graph])
            if isinstance(box, dict) and n <= 2 * k:
                # A dict of running sums (`totals[name] = totals.get(name, 0) + loss`): its length stays, the
                # graph of each value grows. The largest one, like a single tensor's.
                counted = [self._nodes(t.grad_fn, walked) for t in graph]
                record.update(graph_nodes=max(c[0] for c in counted), truncated=any(c[1] for c in counted))
        return record

    def _dict_of_lists(self, box: dict, walked: dict) -> dict[str, Any] | None:
        """A dict of per-key lists (`running[metric].append((n, value))`): the lists' records summed, as one
        holder named by the dict."""
        parts = [self._container(v, walked) for v in list(box.values())[:MAX_OBJECTS]
                 if type(v) in (list, deque) and len(v) > 0]
        parts = [p for p in parts if p is not None]
        if not parts:
            return None
        record: dict[str, Any] = {"kind": "dict of lists", "in_lists": True}
        for key in ("length", "tensors", "graph_tensors"):
            record[key] = sum(int(p.get(key) or 0) for p in parts)
        record["mib"] = round(sum(float(p.get("mib") or 0.0) for p in parts), 4)
        roots = [r for p in parts for r in p.get("_roots") or []]
        if roots:
            record.update(graph_nodes_each=max(int(p.get("graph_nodes_each") or 0) for p in parts),
                          truncated=any(p.get("truncated") for p in parts), _roots=roots)
        return record

    def _dict_tensors(self, value: Any, limit: int = 16) -> list[Any]:
        """The graph-holding tensors among a dict element's values, or a short tuple's (`(batch_size, loss)`):
        what a list of per-step records keeps alive that matters (detached metrics in them are a few bytes a
        step, and a state_dict is no plain dict)."""
        if type(value) is dict and value:
            items = list(value.values())[:limit]
        elif type(value) in (tuple, list) and 0 < len(value) <= MAX_PAIR:
            items = list(value)
        else:
            return []
        return [v for v in items if self.is_tensor(v) and getattr(v, "grad_fn", None) is not None]
