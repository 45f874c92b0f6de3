"""A symptom names the line a user changes, when the call that caused it sits in the script's own wrapper, factory,
helper or condition (issue 13, run15lineb): thin wrappers of zero_grad()/step()/backward(), a DataLoader built in
a data module's method or a subclass, a scheduler.step() that never ran, a checkpoint helper's optional optimizer
left out, an inline model.eval() before a prediction helper. Each bug with a healthy twin that stays silent."""

from __future__ import annotations

import pytest

from tests.test_run_support import assert_sound, diagnosed, line_of, shared_run
from torchdoctor import exitcodes

pytestmark = pytest.mark.slow


def _run(tmp_path_factory, validate_report, script: str, *modes: str, done: str):
    result = shared_run(tmp_path_factory, f"{script[:-3]}-{'-'.join(modes)}", script, "--fail-on", "never", "--",
                        *modes)
    assert_sound(result, validate_report, exitcodes.OK)
    assert done in result.stdout + result.stderr
    return result


def _lines(symptom: dict) -> list[int | None]:
    return [(e.get("location") or {}).get("line") for e in symptom["evidence"]]


@pytest.mark.parametrize(("mode", "symptom", "text"), [
    ("zero", "zero-grad-every-micro-step", "            optim.zero_grad()"),  # the loop's call of the wrapper
    ("backward", "missing-zero-grad", "        self.backward(loss)"),  # train_step's call of the trainer's backward()
    ("sched", "scheduler-granularity", "                sched.step()"),  # the batch loop's call of the wrapper
    ("trainstep", "scheduler-granularity", "self.sched.step()"),  # inside a step(x, y) that trains: no wrapper
    ("both", "scheduler-order", "self.lr_scheduler.step()"),  # a step() that orders two steps: no wrapper
])
def test_a_thin_wrapper_of_the_call_is_named_where_it_is_called(tmp_path_factory, validate_report, mode, symptom,
                                                                text):
    result = _run(tmp_path_factory, validate_report, "line_through_wrappers.py", mode, done="wrappers done")
    found = result.symptoms(symptom)
    assert len(found) == 1, result.report["symptoms"]
    assert found[0]["location"]["line"] == line_of("line_through_wrappers.py", text), found[0]["location"]


@pytest.mark.parametrize("mode", ["zero", "backward", "sched"])
def test_wrappers_used_right_are_silent(tmp_path_factory, validate_report, mode):
    result = _run(tmp_path_factory, validate_report, "line_through_wrappers.py", mode, "healthy",
                  done="wrappers done")
    assert diagnosed(result) == [], result.report["symptoms"]


@pytest.mark.heavy  # worker processes started 4 times per case
@pytest.mark.parametrize(("mode", "where", "cause"), [
    ("module", "return DataLoader(self.train_set", "loader = once or dm.train_loader()"),
    ("subclass", "loader = WorkerLoader(dm.train_set", None),
    ("healthy", None, None),
])
def test_a_loader_built_every_epoch_names_the_loops_call(tmp_path_factory, validate_report, mode, where, cause):
    result = _run(tmp_path_factory, validate_report, "loader_built_in_loop.py", mode, done="loaders done")
    found = result.symptoms("dataloader-rebuilt")
    if where is None:
        assert diagnosed(result) == [], result.report["symptoms"]
        return
    assert len(found) == 1, result.report["symptoms"]
    assert found[0]["location"]["line"] == line_of("loader_built_in_loop.py", where), found[0]["location"]
    lines = _lines(found[0])
    if cause is None:
        assert lines == [found[0]["location"]["line"]], lines  # built inline in the loop: one line
    else:
        assert lines[1:] == [line_of("loader_built_in_loop.py", cause)], lines
        assert found[0]["evidence"][0]["values"]["loop_call_line"] == lines[1]


@pytest.mark.parametrize("mode", ["bug", "healthy"])
def test_a_scheduler_step_that_never_ran_is_named(tmp_path_factory, validate_report, mode):
    result = _run(tmp_path_factory, validate_report, "scheduler_step_never_reached.py", mode, done="schedule done")
    found = result.symptoms("scheduler-never-stepped")
    if mode == "healthy":
        assert diagnosed(result) == [], result.report["symptoms"]
        return
    assert len(found) == 1, result.report["symptoms"]
    step = line_of("scheduler_step_never_reached.py", "        scheduler.step()")
    assert found[0]["location"]["line"] == step, found[0]["location"]
    assert _lines(found[0]) == [step, line_of("scheduler_step_never_reached.py", "scheduler = torch.optim")]
    assert found[0]["evidence"][0]["values"]["unrun_step_line"] == step


@pytest.mark.parametrize("mode", ["bug", "healthy"])
def test_a_restore_helper_called_without_the_optimizer_names_the_call(tmp_path_factory, validate_report, mode):
    result = _run(tmp_path_factory, validate_report, "resume_helper_without_optimizer.py", mode, done="resume done")
    found = result.symptoms("resume-optimizer-state-missing")
    if mode == "healthy":
        assert diagnosed(result) == [], result.report["symptoms"]
        return
    assert len(found) == 1, result.report["symptoms"]
    script = "resume_helper_without_optimizer.py"
    call = line_of(script, "start = load_checkpoint(path, model)")
    assert found[0]["location"]["line"] == call, found[0]["location"]
    assert _lines(found[0]) == [call, line_of(script, "if optimizer is not None:")]
    assert "`optimizer`" in found[0]["evidence"][0]["summary"]


@pytest.mark.parametrize("mode", ["bug", "healthy"])
def test_an_inline_eval_before_a_prediction_helper_is_named_itself(tmp_path_factory, validate_report, mode):
    result = _run(tmp_path_factory, validate_report, "eval_inline_through_helper.py", mode, done="inline done")
    found = result.symptoms("eval-mode-missing")
    if mode == "healthy":
        assert diagnosed(result) == [], result.report["symptoms"]
        return
    assert len(found) == 1, result.report["symptoms"]
    assert found[0]["location"]["line"] == line_of("eval_inline_through_helper.py", "    model.eval()")
