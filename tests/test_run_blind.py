"""Runs that must not come back as a quiet "No symptoms": the leak real scripts write most (a loss kept in a
list with its graph), a script that asks importlib for torch's spec before importing it (Hugging Face does),
a probe that fails, and a script with no training in it."""

from __future__ import annotations

import pytest

from tests.test_run_support import assert_sound, line_of, shared_run
from torchdoctor import exitcodes

pytestmark = pytest.mark.slow


def test_a_list_of_losses_with_their_graphs_is_a_leak_named_at_its_line(tmp_path_factory, validate_report):
    result = shared_run(tmp_path_factory, "leak-loss-list", "leak_loss_list.py")
    assert_sound(result, validate_report, exitcodes.FINDINGS)
    assert not result.symptoms("probe-failed"), result.symptoms("probe-failed")
    growth = result.symptoms("memory-growth")
    assert len(growth) == 1 and growth[0]["severity"] == "error"
    assert growth[0]["location"]["line"] == line_of("leak_loss_list.py", "losses.append(loss)")
    held = [e for e in growth[0]["evidence"] if e["values"].get("variable") == "losses"]
    assert held and "autograd graphs" in held[0]["summary"], growth[0]["evidence"]


def test_importlib_find_spec_before_import_torch_still_gets_the_probes(tmp_path_factory, validate_report):
    result = shared_run(tmp_path_factory, "find-spec-first", "find_spec_first.py")
    assert_sound(result, validate_report, exitcodes.OK)
    assert result.run["steps_completed"] == 6
    assert result.run["measurements"]["nan"]["grad_checks"] >= 1
    assert not result.symptoms("nothing-measured")


def test_a_probe_that_fails_is_a_warning_not_a_clean_report(tmp_path_factory, validate_report):
    result = shared_run(tmp_path_factory, "probe-sabotage", "probe_sabotage.py", "--fail-on", "warning")
    assert_sound(result, validate_report, exitcodes.FINDINGS)
    failed = result.symptoms("probe-failed")
    assert len(failed) == 1 and failed[0]["severity"] == "warning", result.report["symptoms"]
    values = failed[0]["evidence"][0]["values"]
    assert values["probe"] == "memory" and "holder scan broken on purpose" in values["error"]
    assert result.run["steps_completed"] == 30  # the script itself ran on, unchanged
    debugging = [r for r in result.report["reports"] if r["specialist"] == "debugging"]
    assert debugging and "memory probe failed" in debugging[0]["diagnosis"]


def test_a_run_with_no_training_says_it_measured_nothing(tmp_path_factory, validate_report):
    result = shared_run(tmp_path_factory, "no-training", "no_training.py", "--fail-on", "warning")
    assert_sound(result, validate_report, exitcodes.FINDINGS)
    blind = result.symptoms("nothing-measured")
    assert len(blind) == 1 and blind[0]["severity"] == "warning"
    assert blind[0]["evidence"][0]["values"]["torch_imported"] is True
    assert "No symptoms" not in result.stdout


def test_training_in_spawned_processes_is_named_as_such_not_warned_about(tmp_path_factory, validate_report):
    result = shared_run(tmp_path_factory, "spawn-training", "spawn_training.py", "--fail-on", "warning")
    assert_sound(result, validate_report, exitcodes.OK)
    assert "worker 0 trained 5 steps" in result.stderr  # the spawned process did train
    blind = result.symptoms("nothing-measured")
    assert len(blind) == 1 and blind[0]["severity"] == "info", result.report["symptoms"]
    values = blind[0]["evidence"][0]["values"]
    assert values["child_processes"] == 1 and values["start_methods"] == ["spawn"], values
    assert values["child_target"] == "torch.multiprocessing.spawn._wrap"
    assert blind[0]["location"]["line"] == line_of("spawn_training.py", "mp.spawn(train")


def test_steps_all_skipped_by_the_grad_scaler_are_not_a_run_that_measured_nothing(tmp_path_factory,
                                                                                   validate_report):
    # The script stepped through GradScaler.step() four times and the scaler refused each (inf gradients): the
    # NaN checks did measure those steps, so "nothing was measured" would contradict the rest of the report.
    result = shared_run(tmp_path_factory, "amp-every-step-skipped", "amp_every_step_skipped.py")
    assert result.run["steps_completed"] == 0
    assert not result.symptoms("nothing-measured"), result.report["symptoms"]
    assert any("skipped every one of the 4 optimizer steps" in n for n in result.report["notes"]), \
        result.report["notes"]
    assert result.symptoms("nan-loss") or result.symptoms("nonfinite-grad"), result.report["symptoms"]
