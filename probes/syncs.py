"""Count the calls that make the host wait for the device, with the user's line, for a few steps.

`.item()`, `.tolist()`, `.numpy()`, `.cpu()`, `bool(t)` (an `if` on a
tensor), `float(t)`, `int(t)`, `f"{t:.3f}"` and `torch.cuda.synchronize()`
each copy a value to the host: on CUDA the CPU stops until every kernel
queued so far has run, so it can no longer run ahead and queue the next
ones. On a CPU-only run nothing waits, but the same calls are counted: they
are the syncs the script will make on a GPU.

Only calls made directly from the user's files are counted (torch's own
internal `.item()` on CPU step counters is not a sync); on a CUDA run only
calls on CUDA tensors. The methods are replaced on `torch.Tensor` for the
profile window only and restored afterwards, exactly as they were. Cost while
active: ~0.5 µs per call of those methods; nothing outside the window.
"""

from __future__ import annotations

import sys
from collections import Counter
from typing import Any

from torchdoctor.probes.transparent import transparent
from torchdoctor.probes.userframes import is_library_file

METHODS = {
    "item": ".item()",
    "tolist": ".tolist()",
    "numpy": ".numpy()",
    "cpu": ".cpu()",
    "__bool__": "bool(tensor)",
    "__float__": "float(tensor)",
    "__int__": "int(tensor)",
    "__format__": "format(tensor)",
}


class SyncCounter:
    def __init__(self, torch: Any, cuda: bool) -> None:
        self.torch = torch
        self.cuda = cuda  # count only CUDA tensors' calls
        self.calls: Counter[tuple[str, str, int, str]] = Counter()  # (call, path, line, function)
        self._saved: list[tuple[Any, str, Any, bool]] = []

    def start(self) -> None:
        torch = self.torch
        for method, shown in METHODS.items():
            own = method in torch.Tensor.__dict__
            original = getattr(torch.Tensor, method)
            self._saved.append((torch.Tensor, method, original, own))
            setattr(torch.Tensor, method, self._wrap(original, shown, tensor_method=True))
        if self.cuda and hasattr(torch.cuda, "synchronize"):
            original = torch.cuda.synchronize
            self._saved.append((torch.cuda, "synchronize", original, True))
            torch.cuda.synchronize = self._wrap(original, "torch.cuda.synchronize()", tensor_method=False)

    def stop(self) -> None:
        for owner, name, original, own in reversed(self._saved):
            if own:
                setattr(owner, name, original)
            else:
                try:
                    delattr(owner, name)
                except AttributeError:
                    setattr(owner, name, original)
        self._saved = []

    def _wrap(self, original: Any, shown: str, tensor_method: bool) -> Any:
        counter = self
        cuda = self.cuda

        def counted(*args: Any, **kwargs: Any) -> Any:
            frame = sys._getframe(1)
            path = frame.f_code.co_filename
            if not is_library_file(path) and (
                not tensor_method or not cuda or (args and getattr(args[0], "is_cuda", False))
            ):
                counter.calls[(shown, path, frame.f_lineno, frame.f_code.co_name)] += 1
            return original(*args, **kwargs)

        counted.__wrapped__ = original  # type: ignore[attr-defined]
        counted.__name__ = getattr(original, "__name__", shown)
        counted.__doc__ = getattr(original, "__doc__", None)
        return transparent(counted)

    def summary(self, steps: int, top: int = 5) -> list[dict[str, Any]]:
        rows = []
        for (call, path, line, function), n in self.calls.most_common(top):
            rows.append({"call": call, "path": path, "line": line, "function": function, "count": n,
                         "per_step": round(n / max(steps, 1), 3)})
        return rows
