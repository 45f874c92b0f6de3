"""torchdoctor: a triage desk for PyTorch training scripts.

Importing this package (and `torchdoctor.cli`) must not import torch: the
light commands (`ask`, `check`, `explain`, `routes`, `schema`) start fast.
"""

__version__ = "0.1.0"
