"""`accumulation-not-applied` measured by `run`: the loss divided by a count named for accumulation, and an
optimizer step after every backward. Healthy twins: the same division with the step under the accumulation test,
a mean of three loss terms (× 1/3) and a half squared error (× 0.5), both stepping every batch."""

from __future__ import annotations

import pytest

from tests.test_run_support import assert_sound, line_of, shared_run
from torchdoctor import exitcodes

pytestmark = pytest.mark.slow

SCRIPT = "accumulation_not_applied.py"


def _run(tmp_path_factory, validate_report, how: str):
    result = shared_run(tmp_path_factory, f"accumulation-not-applied-{how}", SCRIPT, "--fail-on", "never", "--", how)
    assert_sound(result, validate_report, exitcodes.OK)
    assert "training done" in result.stdout + result.stderr
    return result


def test_a_divided_loss_stepped_on_every_batch_is_named_at_the_division(tmp_path_factory, validate_report):
    result = _run(tmp_path_factory, validate_report, "bug")
    found = result.symptoms("accumulation-not-applied")
    assert len(found) == 1 and found[0]["severity"] == "warning", result.report["symptoms"]
    assert found[0]["location"]["line"] == line_of(SCRIPT, "loss = loss / self.grad_accum_steps")
    measured = [e for e in found[0]["evidence"] if e.get("kind") == "probe"]
    values = measured[0]["values"]
    assert values["micro_steps"] == 4 and values["loss_factor"] == 0.25, values
    assert values["steps"] == values["single_backward_steps"] == 48, values
    assert "grad_accum_steps" in measured[0]["summary"]
    # SGD's step is proportional to the gradient: the division shrinks every update (Adam's would not)
    assert "1/4 of the size" in measured[0]["summary"] and "optimizer" not in values, measured[0]


# the half squared error (× 0.5 read as 2 micro-steps) is the rarer shape: kept with the heavy tests
@pytest.mark.parametrize("how", ["healthy", "mean", pytest.param("half", marks=pytest.mark.heavy)])
def test_accumulation_that_steps_once_per_window_and_plain_loss_factors_are_silent(tmp_path_factory,
                                                                                    validate_report, how):
    result = _run(tmp_path_factory, validate_report, how)
    assert not result.symptoms("accumulation-not-applied"), result.report["symptoms"]
