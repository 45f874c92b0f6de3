"""torchdoctor: a triage desk for PyTorch training scripts.

Importing this package (and `torchdoctor.cli`) must not import torch: the
light commands (`ask`, `check`, `explain`, `routes`, `schema`) start fast.
The Python API is loaded on first use (PEP 562 `__getattr__`):

    with torchdoctor.watch() as session: ...     # doctor/watching.py
    torchdoctor.LightningCallback()              # doctor/callbacks.py (pip install torchdoctor[lightning])
    torchdoctor.TrainerCallback()                # doctor/callbacks.py (pip install torchdoctor[hf])
"""

from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "watch": "torchdoctor.watching",
    "Watch": "torchdoctor.watching",
    "LightningCallback": "torchdoctor.callbacks",
    "TrainerCallback": "torchdoctor.callbacks",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'torchdoctor' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


def load_ipython_extension(ipython: Any) -> None:
    """`%load_ext torchdoctor`: the `%%torchdoctor` cell magic (doctor/magic.py)."""
    from torchdoctor.magic import register

    register(ipython)
