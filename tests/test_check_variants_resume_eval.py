"""Two bugs in the shapes real projects use, not only the shapes our dev bugs came in: a resume that reads a
checkpoint lacking the optimizer, scheduler or GradScaler the training steps, and a validation pass that runs a
model with dropout or batch norm in training mode. Shapes: a plain script, a trainer class keeping the model and
optimizer on self, train/evaluate functions called from main.py, the model class / state helper / loader factory
in another file, an object picked by the command line, names that say nothing. Each shape is a folder with a `bad`
project (the line a diagnosis must name ends in `# variant: TDxxx`) and a `good` twin that must stay silent.
`check` runs on each folder as it would from the command line (the project pass included)."""

from __future__ import annotations

import re

import pytest

from tests.check_variants_support import VARIANTS, findings, marked, near, shapes

CODES = {  # the rules that speak for each family
    "resume_missing_state": {"TD701", "TD707"},
    "validation_in_train_mode": {"TD601"},
}
SHAPES = shapes(CODES)
MARK = re.compile(r"#\s*variant:\s*TD\d{3}\s*$")


@pytest.mark.parametrize(("family", "shape"), SHAPES)
def test_variant_is_found_and_its_twin_stays_silent(family: str, shape: str, monkeypatch) -> None:
    bad, good = VARIANTS / family / shape / "bad", VARIANTS / family / shape / "good"
    lines = marked(bad, MARK)
    assert lines, "a bad variant marks its line with `# variant: TDxxx`"
    hits = findings(bad, monkeypatch, CODES[family])
    assert near(hits, lines), hits
    assert not findings(good, monkeypatch, CODES[family])


def test_the_pre_pass_knows_which_project_classes_carry_mode_layers() -> None:
    """A module class whose body builds a dropout or batch-norm layer, and its subclass in another file, change with
    train()/eval(); a plain one does not, and a class that is no torch module is never listed."""
    from torchdoctor.rules.static.semantic import projectclasses

    table = projectclasses.build([
        ("nets.base", "import torch.nn as nn\n\n\nclass Backbone(nn.Module):\n    def __init__(self):\n"
                      "        super().__init__()\n        self.bn = nn.BatchNorm2d(8)\n\n\n"
                      "class Plain(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                      "        self.fc = nn.Linear(2, 2)\n"),
        ("nets.heads", "from nets.base import Backbone\n\n\nclass Classifier(Backbone):\n    pass\n\n\n"
                       "class Notes:\n    dropout = 0.1\n"),
    ])
    assert table.has_mode_layers("nets.base.Backbone") and table.has_mode_layers("heads.Classifier")
    assert not table.has_mode_layers("nets.base.Plain") and not table.has_mode_layers("nets.heads.Notes")
    assert table.has_module("nets.heads") and table.has_module("nets") and not table.has_module("torch")
