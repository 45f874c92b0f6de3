"""Debugging: NaN/Inf, instability, a model that does not learn, eval-mode and autograd errors.

One specialist (`SPECIALIST`, id `debugging`) whose handlers live in one module per symptom
family; importing the package registers them all:

- nonfinite.py   NaN/Inf in the loss, gradients or inputs; exploding and vanishing gradients
- learning.py    a model that does not learn: flat loss, wrong loss inputs, missing zero_grad
- validation.py  evaluation code that records graphs, trains or stays in train mode
- errors.py      errors a traceback names (in-place, backward twice, device/dtype/index errors)
- process.py     hangs, crashes, missing CUDA, runs that measured nothing
- shared.py      the specialist object and the fixes several families rank

The fixes themselves are data (rules/data/advice/debugging.toml, one file for the package); the
modules decide which apply, in which order, and which line each is pinned to.
"""

from __future__ import annotations

from torchdoctor.specialists.base import Advice, Case
from torchdoctor.specialists.debugging import errors, learning, nonfinite, process, validation  # noqa: F401 - they register
from torchdoctor.specialists.debugging.shared import SPECIALIST, at_step, clip_fix, input_check_fix


@SPECIALIST.general
def general(case: Case) -> Advice:
    symptom = case.symptom.title[:1].lower() + case.symptom.title[1:]
    return Advice(
        f"From the debugging side of {symptom}{at_step(case)}: reproduce it on a small seeded run and find the "
        "first step and module where values go wrong before changing the setup.",
        [input_check_fix(), clip_fix(case)],
        [f"`{case.run_cmd('nan', extra='--steps 50')}` checks loss, gradients and parameters every step."],
    )
