"""Healthy real scripts must not get a false warning: GAN-style loops with two optimizers, the nan probe's own
replay of a step, a script that fails before its first backward, a gradient-reversal layer."""

from __future__ import annotations

import pytest

from tests.test_run_support import assert_sound, diagnosed, line_of, shared_run
from torchdoctor import exitcodes

pytestmark = pytest.mark.slow


def test_a_forward_used_by_the_second_backward_after_it_is_no_evaluation(tmp_path_factory, validate_report):
    result = shared_run(tmp_path_factory, "gan-two-optimizers", "gan_two_optimizers.py", "--fail-on", "warning")
    assert_sound(result, validate_report, exitcodes.OK)
    assert diagnosed(result) == [], result.report["symptoms"]
    counts = result.run["measurements"]["validation"]
    assert counts["trained"] == 90 and counts["eval_grad"] == 0, counts  # 3 forwards a step, 30 steps


def test_the_nan_probes_replay_is_not_an_evaluation_forward(tmp_path_factory, validate_report):
    result = shared_run(tmp_path_factory, "nan-dropout-replay", "nan_dropout_replay.py", "--fail-on", "never")
    assert_sound(result, validate_report, exitcodes.OK)
    # launch-bound / slow-step at info depend on how fast this machine runs 237 small operators: not the point here
    assert [s["id"] for s in diagnosed(result)] == ["nan-loss"], result.report["symptoms"]
    counts = result.run["measurements"]["validation"]
    assert counts["forwards"] == 20 and counts["trained"] == 20, counts  # the script's own 20 forwards only


def test_a_forward_cut_off_by_a_crash_is_no_evaluation(tmp_path_factory, validate_report):
    result = shared_run(tmp_path_factory, "crash-before-backward", "crash_before_backward.py", "--fail-on", "never")
    assert_sound(result, validate_report, exitcodes.SCRIPT_FAILED)
    assert result.run["stopped"] == "crashed"
    assert result.run["error"]["location"]["line"] == line_of("crash_before_backward.py", "raise RuntimeError")
    assert not result.symptoms("eval-without-no-grad"), result.report["symptoms"]


def test_a_gradient_reversal_layer_is_a_deliberate_transform_not_a_bad_backward(tmp_path_factory, validate_report):
    result = shared_run(tmp_path_factory, "grad-reverse", "grad_reverse.py", "--fail-on", "never")
    assert_sound(result, validate_report, exitcodes.OK)
    bad = result.symptoms("bad-custom-backward")
    named = [e["values"].get("function") for s in bad for e in s["evidence"]]
    assert "BadSquare" in named and "GradReverse" not in named and "RoundThrough" not in named, named
    assert len(bad) == 1 and bad[0]["location"]["line"] == line_of("grad_reverse.py", "return grad_output * x") - 2
    assert "GradReverse: a deliberate gradient transform (backward = -0.5 × grad)" in (
        result.run["measurements"]["gradcheck"]["summary"])
    assert any("`GradReverse`" in n and "deliberate gradient transform" in n for n in result.report["notes"])
    assert any("`RoundThrough`" in n and "straight-through" in n for n in result.report["notes"])


# Two runs of ~10 s each: heavy, to keep the default suite inside its budget.
@pytest.mark.heavy
def test_heads_run_inside_the_agents_forward_are_part_of_it_not_evaluations(tmp_path_factory, validate_report):
    # Found on Lightning's Fabric PPO example: the critic head, called alone in rollouts, was judged an evaluation
    # with grad when the agent's forward ran it inside the update, whose loss does use it.
    healthy = shared_run(tmp_path_factory, "actor-critic-heads", "actor_critic_heads.py", "--fail-on", "warning")
    assert_sound(healthy, validate_report, exitcodes.OK)
    assert diagnosed(healthy) == [], healthy.report["symptoms"]
    counts = healthy.run["measurements"]["validation"]
    assert counts["eval_grad"] == 0 and counts["trained"] == 24, counts  # 12 updates x 2 epochs, one per forward
    scored = shared_run(tmp_path_factory, "actor-critic-heads-eval", "actor_critic_heads.py", "--fail-on", "never",
                        "--", "--eval-with-grad")
    assert_sound(scored, validate_report, exitcodes.OK)
    [found] = scored.symptoms("eval-without-no-grad")
    assert found["location"]["line"] == line_of("actor_critic_heads.py", "score = agent("), found
