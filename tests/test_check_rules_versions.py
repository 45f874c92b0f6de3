"""Version-aware rules of the profiling/debugging/checkpointing/autograd families follow the targeted
torch (the installed one, or `[tool.torchdoctor] torch-version`)."""

from __future__ import annotations

import pytest

from torchdoctor.rules.static.engine import analyse_text

LOAD = """
import torch

state = torch.load("checkpoint.pt")
"""
LOAD_WITH_PICKLE = """
import pickle

import torch

state = torch.load("checkpoint.pt", pickle_module=pickle)
"""
CHECKPOINT = """
from torch.utils.checkpoint import checkpoint


def run(block, x):
    return checkpoint(block, x)
"""


def codes(text: str, code: str, version) -> list[str]:
    return [r.finding.code for r in analyse_text(text, codes=[code], torch_version=version).results]


@pytest.mark.parametrize(
    "version,fires",
    [((1, 12), False), ((1, 13), True), ((2, 5), True), ((2, 6), False), ((2, 13), False), (None, False)],
)
def test_torch_load_without_weights_only_follows_the_2_6_default(version, fires):
    assert codes(LOAD, "TD702", version) == (["TD702"] if fires else [])


@pytest.mark.parametrize("version", [(2, 4), (2, 6), None])
def test_pickle_module_turns_the_safe_default_off_in_every_version(version):
    assert codes(LOAD_WITH_PICKLE, "TD702", version) == ["TD702"]


def test_the_message_says_which_default_applies():
    (result,) = analyse_text(LOAD, codes=["TD702"], torch_version=(2, 4)).results
    assert "pre-2.6 default `weights_only=False`" in result.finding.message
    assert result.values["variable"] == 'torch.load("checkpoint.pt")'


@pytest.mark.parametrize("version,fires", [((1, 10), False), ((1, 11), True), ((2, 13), True), (None, True)])
def test_use_reentrant_is_asked_for_where_the_argument_exists(version, fires):
    assert codes(CHECKPOINT, "TD804", version) == (["TD804"] if fires else [])
