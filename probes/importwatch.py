"""Call a function right after a module is imported, without importing it ourselves.

The bootstrap must not import torch before the script does: a script may set
OMP_NUM_THREADS or similar before `import torch`, and a script that never
imports torch should not pay for it. So the probes that need torch are
installed by a one-shot meta-path finder the moment the script's own
`import torch` has finished executing torch/__init__.py.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any


class _Loader:
    """Wraps the real loader: execute the module, then call back."""

    def __init__(self, loader: Any, callback: Callable[[ModuleType], None], watcher: _Watcher):
        self._loader = loader
        self._callback = callback
        self._watcher = watcher

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        if self._watcher in sys.meta_path:  # one-shot: the module now runs, later imports find it in sys.modules
            sys.meta_path.remove(self._watcher)
        # Put the real loader back so the module looks exactly as imported normally.
        try:
            module.__loader__ = self._loader
            if module.__spec__ is not None:
                module.__spec__.loader = self._loader
        except (AttributeError, TypeError):
            pass
        try:
            self._callback(module)
        except Exception:  # noqa: BLE001 - never break the script's import
            pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class _Watcher:
    def __init__(self, name: str, callback: Callable[[ModuleType], None]):
        self.name = name
        self.callback = callback
        self.busy = False

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name or self.busy:
            return None
        self.busy = True
        try:
            spec = None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self.busy = False
        if spec is None or spec.loader is None:
            return None
        # The watcher stays in sys.meta_path until the module is executed: `importlib.util.find_spec("torch")`
        # (transformers' is_torch_available()) asks for a spec without importing, and the real import comes later.
        spec.loader = _Loader(spec.loader, self.callback, self)
        return spec

    def invalidate_caches(self) -> None:
        pass


def when_imported(name: str, callback: Callable[[ModuleType], None]) -> None:
    """Call `callback(module)` once `name` is imported (now, if it already is)."""
    module = sys.modules.get(name)
    if module is not None:
        callback(module)
        return
    sys.meta_path.insert(0, _Watcher(name, callback))
