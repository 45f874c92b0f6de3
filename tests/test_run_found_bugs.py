"""Bugs of real training scripts the run probes used to miss or place wrongly (bench/realcode/run_bugs): zero_grad
between the micro-steps of one optimizer step, model.train() not restored after a validation routine, float16
overflow in masked_fill, graphs kept in dicts and in lists of dicts."""

from __future__ import annotations

import pytest

from tests.test_run_support import RunResult, assert_sound, diagnosed, line_of, shared_run
from torchdoctor import exitcodes

pytestmark = pytest.mark.slow


def _bug_or_twin(tmp_path_factory, validate_report, name: str, script: str, how: str, done: str, symptom: str,
                 line_text: str, bug: bool | None = None) -> tuple[RunResult, dict | None]:
    """Run `script` with `how` to its `done` line: a bug case (`bug`, by default every `how` but "healthy") gives
    one `symptom` at the line holding `line_text`, a healthy twin none. Returns the run and the bug's symptom
    (None for a twin)."""
    result = shared_run(tmp_path_factory, f"{name}-{how}", script, "--fail-on", "never", "--", how)
    assert_sound(result, validate_report, exitcodes.OK)
    assert done in result.stdout + result.stderr
    found = result.symptoms(symptom)
    if not (how != "healthy" if bug is None else bug):
        assert not found, result.report["symptoms"]
        return result, None
    assert len(found) == 1, result.report["symptoms"]
    assert found[0]["location"]["line"] == line_of(script, line_text), found[0]
    return result, found[0]


def test_zero_grad_before_every_micro_step_is_named_at_its_line(tmp_path_factory, validate_report):
    result = shared_run(tmp_path_factory, "zero-grad-micro-steps", "zero_grad_micro_steps.py", "--fail-on", "error")
    assert_sound(result, validate_report, exitcodes.FINDINGS)
    found = result.symptoms("zero-grad-every-micro-step")
    assert len(found) == 1 and found[0]["severity"] == "error", result.report["symptoms"]
    assert found[0]["location"]["line"] == line_of("zero_grad_micro_steps.py", "opt.zero_grad()")
    values = found[0]["evidence"][0]["values"]
    assert values["backwards_per_step"] == 4 and values["zeroed_steps"] == 12 and values["steps"] == 12, values


def test_zero_grad_at_the_top_of_accelerates_accumulate_block_is_named_at_its_line(tmp_path_factory, validate_report):
    # Accelerate skips the wrapped zero_grad() except on the syncing micro-step, where it clears the 3 before it
    pytest.importorskip("accelerate", reason="accelerate is an optional test extra")
    result = shared_run(tmp_path_factory, "zero-grad-accelerate", "zero_grad_inside_accelerate_window.py",
                        "--fail-on", "error")
    assert_sound(result, validate_report, exitcodes.FINDINGS)
    found = result.symptoms("zero-grad-every-micro-step")
    assert len(found) == 1 and found[0]["severity"] == "error", result.report["symptoms"]
    assert found[0]["location"]["line"] == line_of("zero_grad_inside_accelerate_window.py", "opt.zero_grad()")
    values = found[0]["evidence"][0]["values"]
    assert values["backwards_per_step"] == 4 and values["dropped_micro_steps"] == 3, values
    assert values["zeroed_steps"] == 12 and values["steps"] == 12, values


def test_zero_grad_of_another_optimizer_between_backward_and_step_is_healthy(tmp_path_factory, validate_report):
    result = shared_run(tmp_path_factory, "zero-grad-two-optimizers", "zero_grad_two_optimizers.py",
                        "--fail-on", "warning")
    assert_sound(result, validate_report, exitcodes.OK)
    assert diagnosed(result) == [], result.report["symptoms"]


def test_an_lbfgs_closure_zeroing_inside_its_step_is_no_micro_step_zeroing(tmp_path_factory, validate_report):
    result = shared_run(tmp_path_factory, "lbfgs-closure", "lbfgs_closure.py", "--fail-on", "never")
    assert_sound(result, validate_report, exitcodes.OK)
    assert result.run["steps_completed"] == 12
    assert result.run["measurements"]["accumulation"]["backwards"] >= 24  # several closure calls per step
    assert not result.symptoms("zero-grad-every-micro-step"), result.report["symptoms"]
    assert not result.symptoms("partial-accumulation-dropped")


def test_per_task_gradients_read_between_backwards_of_one_graph_are_healthy(tmp_path_factory, validate_report):
    result = shared_run(tmp_path_factory, "per-task-gradients", "per_task_gradients.py", "--fail-on", "never")
    assert_sound(result, validate_report, exitcodes.OK)
    assert result.run["steps_completed"] == 20
    assert not result.symptoms("zero-grad-every-micro-step"), result.report["symptoms"]


def test_masked_fill_of_minus_1e9_into_float16_is_fp16_overflow_at_its_line(tmp_path_factory, validate_report):
    result = shared_run(tmp_path_factory, "fp16-mask-fill", "fp16_mask_fill.py", "--fail-on", "never")
    assert_sound(result, validate_report, exitcodes.SCRIPT_FAILED)
    assert "without overflow" in result.run["error"]["message"]
    found = result.symptoms("fp16-overflow")
    assert len(found) == 1, result.report["symptoms"]
    assert found[0]["location"]["line"] == line_of("fp16_mask_fill.py", "masked_fill(mask, -1e9)")
    assert found[0]["evidence"][0]["values"]["dtype"] == "c10::Half"


def test_train_mode_not_restored_is_named_at_the_call_that_ran_the_evaluation(tmp_path_factory, validate_report):
    result = shared_run(tmp_path_factory, "train-not-restored-call", "train_not_restored_call.py",
                        "--fail-on", "never")
    assert_sound(result, validate_report, exitcodes.OK)
    found = result.symptoms("eval-mode-missing")
    assert len(found) == 1, result.report["symptoms"]
    values = found[0]["evidence"][0]["values"]
    assert values["train_not_restored"] is True and values["resumed_at_step"] == 5, values
    line = line_of("train_not_restored_call.py", "score = run_validation(model, val_batches)")
    assert found[0]["location"]["line"] == line and found[0]["location"]["function"] == "fit", found[0]["location"]
    assert f"the evaluation that line {line} runs (in fit)" in found[0]["evidence"][0]["summary"]
    assert not result.symptoms("eval-without-no-grad")


def test_train_mode_not_restored_after_inline_evaluation_is_named_at_its_eval_call(tmp_path_factory,
                                                                                  validate_report):
    result = shared_run(tmp_path_factory, "eval-inline", "eval_inline_not_restored.py", "--fail-on", "never")
    assert_sound(result, validate_report, exitcodes.OK)
    found = result.symptoms("eval-mode-missing")
    assert len(found) == 1, result.report["symptoms"]
    line = line_of("eval_inline_not_restored.py", "    model.eval()")
    assert found[0]["location"]["line"] == line, found[0]["location"]
    assert f"after the model.eval() of line {line}" in found[0]["evidence"][0]["summary"]


@pytest.mark.parametrize(("keep", "text", "variable", "how"), [
    ("outputs", 'outputs.append({"loss": loss', "outputs", "tensors_growth_per_step"),
    ("totals", "totals[name] = totals.get(name, 0) + value", "totals", "graph_nodes_growth_per_step"),
])
def test_graphs_kept_in_dicts_are_a_leak_named_at_their_line(tmp_path_factory, validate_report, keep, text,
                                                               variable, how):
    result = shared_run(tmp_path_factory, f"leak-dicts-{keep}", "leak_dicts.py", "--fail-on", "never", "--", keep)
    assert_sound(result, validate_report, exitcodes.OK)
    growth = result.symptoms("memory-growth")
    assert len(growth) == 1, result.report["symptoms"]
    assert growth[0]["location"]["line"] == line_of("leak_dicts.py", text), growth[0]["location"]
    held = [e for e in growth[0]["evidence"] if e["values"].get("variable") == variable]
    assert held and held[0]["values"][how] > 0, growth[0]["evidence"]


def test_a_list_of_dicts_of_detached_values_keeps_no_graph(tmp_path_factory, validate_report):
    result = shared_run(tmp_path_factory, "leak-dicts-detached", "leak_dicts.py", "--fail-on", "never", "--",
                        "detached")
    assert_sound(result, validate_report, exitcodes.OK)
    assert not result.symptoms("memory-growth"), result.report["symptoms"]


def test_gradients_never_cleared_are_missing_zero_grad_at_the_backward(tmp_path_factory, validate_report):
    result = shared_run(tmp_path_factory, "never-zeroed", "never_zeroed.py", "--fail-on", "error")
    assert_sound(result, validate_report, exitcodes.FINDINGS)
    found = result.symptoms("missing-zero-grad")
    assert len(found) == 1 and found[0]["severity"] == "error", result.report["symptoms"]
    assert found[0]["location"]["line"] == line_of("never_zeroed.py", "loss.backward()")
    assert found[0]["location"]["function"] == "train"
    values = found[0]["evidence"][0]["values"]
    assert values["stale_steps"] >= 2 and values["stale_steps"] == values["steps_checked"], values


def test_log_of_zero_inside_a_loss_module_is_named_at_its_line(tmp_path_factory, validate_report):
    # The criterion is a module without parameters called on the model's output: the replay runs it too.
    result = shared_run(tmp_path_factory, "loss-module-log", "loss_module_log.py", "--fail-on", "never")
    assert_sound(result, validate_report, exitcodes.OK)
    found = result.symptoms("nan-loss")
    assert len(found) == 1, result.report["symptoms"]
    assert found[0]["location"]["line"] == line_of("loss_module_log.py", "* torch.log(p_t)).mean()")
    assert found[0]["location"]["function"] == "forward"
    assert found[0]["evidence"][0]["values"]["op"] == "torch.log"
    assert "loss computation itself" not in found[0]["evidence"][0]["summary"]


def test_a_float16_overflow_under_autocast_is_found_in_the_layer_not_the_loss(tmp_path_factory, validate_report):
    result = shared_run(tmp_path_factory, "fp16-overflow-linear", "fp16_overflow_linear.py", "--fail-on", "never")
    assert_sound(result, validate_report, exitcodes.OK)
    found = result.symptoms("nan-loss")
    assert len(found) == 1, result.report["symptoms"]
    evidence = found[0]["evidence"][0]
    assert evidence["values"]["first_bad_module"] == "model.0", evidence
    assert evidence["values"]["autocast"] == "float16 on cpu"
    assert "float16 autocast" in evidence["summary"] and "loss computation itself" not in evidence["summary"]


@pytest.mark.parametrize(("shape", "text", "function"), [
    ("module", "                                torch.nn.Softmax(dim=1))", "<module>"),  # the layer, not model(x)
    ("criterion", "proba = torch.softmax(scores, dim=-1)", "matching_loss"),
    ("labels", "weights = F.softmax(scores, dim=1)", "label_attention"),
])
def test_probabilities_into_cross_entropy_are_softmax_before_loss_at_the_softmax(tmp_path_factory, validate_report,
                                                                                 shape, text, function):
    result = shared_run(tmp_path_factory, f"softmax-into-ce-{shape}", "softmax_into_ce.py", "--fail-on", "error",
                        "--", shape)
    assert_sound(result, validate_report, exitcodes.FINDINGS)
    found = result.symptoms("softmax-before-loss")
    assert len(found) == 1 and found[0]["severity"] == "error", result.report["symptoms"]
    assert found[0]["location"]["line"] == line_of("softmax_into_ce.py", text)
    assert found[0]["location"]["function"] == function
    assert found[0]["evidence"][0]["values"]["loss_op"] == "log_softmax"


def test_the_softmax_watch_leaves_torch_as_it_found_it():
    import torch
    import torch.nn.functional as F

    from torchdoctor.probes.lossgraph import SoftmaxSites, find_double_softmax

    before = (torch.softmax, F.softmax, torch.exp, "exp" in vars(torch.Tensor), "softmax" in vars(torch.Tensor))
    import warnings

    from torchdoctor.probes.restore import Ledger

    softmax_init, warn = torch.nn.Softmax.__init__, warnings.warn
    ledger = Ledger()  # what a watch() block does around its probes
    ledger.snapshot()
    sites = SoftmaxSites(torch)
    sites.arm()
    scores = torch.randn(3, 4, requires_grad=True)
    proba = scores.softmax(-1)
    loss = F.cross_entropy(proba, torch.tensor([0, 1, 2]))
    sites.disarm()
    node, op = find_double_softmax(loss)
    assert op == "log_softmax" and sites.site_of(node)["function"] == "test_the_softmax_watch_leaves_torch_as_it_found_it"
    assert (torch.softmax, F.softmax, torch.exp, "exp" in vars(torch.Tensor), "softmax" in vars(torch.Tensor)) == before
    assert find_double_softmax(F.cross_entropy(scores, torch.tensor([0, 1, 2]))) is None
    assert torch.nn.Softmax.__init__ is not softmax_init  # the construction watch stays until the probe closes
    sites.close()
    assert torch.nn.Softmax.__init__ is softmax_init
    assert ledger.restore() == []  # the warnings hook the wrappers installed goes too
    assert warnings.warn is warn  # a later test or watch() block finds the process untouched


def test_a_steplr_sized_in_epochs_stepped_per_batch_is_scheduler_granularity(tmp_path_factory, validate_report):
    result = shared_run(tmp_path_factory, "steplr-per-batch", "steplr_per_batch.py", "--fail-on", "never")
    assert_sound(result, validate_report, exitcodes.OK)
    found = result.symptoms("scheduler-granularity")
    assert len(found) == 1, result.report["symptoms"]
    assert found[0]["location"]["line"] == line_of("steplr_per_batch.py", "        scheduler.step()")
    values = found[0]["evidence"][0]["values"]
    assert values["stepped_per"] == "batch" and values["steps_taken"] == 80, values
    assert values["lr_spent_at_step"] == 28 and values["lr_final"] < 1e-20, values


def test_a_cosine_sized_in_batches_and_stepped_per_epoch_is_scheduler_granularity(tmp_path_factory,
                                                                                   validate_report):
    result = shared_run(tmp_path_factory, "cosine-epoch", "cosine_epoch_sized_batches.py", "--fail-on", "never")
    assert_sound(result, validate_report, exitcodes.OK)
    found = result.symptoms("scheduler-granularity")
    assert len(found) == 1, result.report["symptoms"]
    assert found[0]["location"]["line"] == line_of("cosine_epoch_sized_batches.py", "    scheduler.step()")
    values = found[0]["evidence"][0]["values"]
    assert values["stepped_per"] == "epoch" and values["steps_taken"] == 4 and values["total_steps"] == 12, values
    built = [e for e in found[0]["evidence"] if "was built here" in e["summary"]]
    assert built and built[0]["location"]["line"] == line_of("cosine_epoch_sized_batches.py", "scheduler = ")
    assert "T_max=12" in built[0]["summary"]


def test_a_loader_with_workers_built_every_epoch_is_dataloader_rebuilt(tmp_path_factory, validate_report):
    result = shared_run(tmp_path_factory, "loader-per-epoch", "loader_per_epoch.py", "--fail-on", "never")
    assert_sound(result, validate_report, exitcodes.OK)
    found = result.symptoms("dataloader-rebuilt")
    assert len(found) == 1 and found[0]["severity"] == "warning", result.report["symptoms"]
    assert found[0]["location"]["line"] == line_of("loader_per_epoch.py", "else DataLoader(data, batch_size=16")
    values = found[0]["evidence"][0]["values"]
    assert values["constructions"] == 8 and values["num_workers"] == 1, values
    assert values["built_at_steps"] == [0, 4, 8, 12, 16] and values["first_batch_ms_total"] > 0, values


def test_a_validation_loop_that_steps_the_optimizer_is_backward_in_validation(tmp_path_factory, validate_report):
    result = shared_run(tmp_path_factory, "eval-phase-valstep", "eval_phase_steps.py", "--fail-on", "error")
    assert_sound(result, validate_report, exitcodes.FINDINGS)
    found = result.symptoms("backward-in-validation")
    assert len(found) == 1 and found[0]["severity"] == "error", result.report["symptoms"]
    assert found[0]["location"]["line"] == line_of("eval_phase_steps.py", "            loss.backward()")
    values = found[0]["evidence"][0]["values"]
    assert values["eval_mode_forwards"] == 12 and values["phases"] == 4 and values["first_step"] == 6, values
    assert not result.symptoms("eval-mode-missing")  # training did come back to train mode each epoch


def test_backward_in_a_validation_pass_that_shares_the_training_function_is_found(tmp_path_factory, validate_report):
    # the Annotated Transformer's shape: run_epoch and its loss computation serve both phases; validation calls
    # backward too and the next training step applies those gradients
    result = shared_run(tmp_path_factory, "eval-phase-shared", "eval_phase_steps.py", "--fail-on", "never",
                        "--", "shared")
    assert_sound(result, validate_report, exitcodes.OK)
    found = result.symptoms("backward-in-validation")
    assert len(found) == 1, result.report["symptoms"]
    assert found[0]["location"]["line"] == line_of("eval_phase_steps.py", "        loss.backward()")
    assert found[0]["location"]["function"] == "run_epoch"
    assert found[0]["evidence"][0]["values"]["eval_mode_forwards"] == 9


@pytest.mark.heavy  # waits out the hang watchdog
def test_a_background_threads_output_does_not_hide_a_hung_main_thread(tmp_path_factory, validate_report):
    result = shared_run(tmp_path_factory, "hang-with-logger", "hang_with_logger.py", "--hang-timeout", "3",
                        "--timeout", "60")
    assert_sound(result, validate_report, exitcodes.SCRIPT_FAILED)
    assert result.run["stopped"] == "hang" and result.run["steps_completed"] == 3
    hang = result.symptoms("hang")
    assert len(hang) == 1 and hang[0]["location"]["line"] == line_of("hang_with_logger.py", "lock.acquire()  #")
    assert "status: alive" in result.stderr  # the logger did write all along


@pytest.mark.distributed
@pytest.mark.parametrize(("how", "text"), [("flag", "model.require_backward_grad_sync = micro == accum - 1"),
                                           # heavy: a 2-rank torchrun per case; the quick suite is at its budget
                                           pytest.param("schedule", "    model.require_backward_grad_sync = False",
                                                        marks=pytest.mark.heavy),
                                           # heavy: a 2-rank torchrun (~4 s); the quick suite was at 603 s on a clean clone of stop 26 (budget 600)
                                           pytest.param("unwrapped", "net = model.module if", marks=pytest.mark.heavy),
                                           # heavy: a 2-rank torchrun per case; the quick suite is at its budget
                                           pytest.param("getter", "loss = F.mse_loss(get_model()(x), y)",
                                                        marks=pytest.mark.heavy)])
def test_ddp_steps_whose_gradients_no_allreduce_reached_are_ranks_diverged(tmp_path_factory, validate_report, how,
                                                                           text):
    from tests.test_run_distributed import dist_run

    result = dist_run(tmp_path_factory, f"sync-off-{how}", "-p", "distributed", "--nproc-per-node", "2",
                      "ddp_sync_off.py", "--", how)
    assert result.returncode in (exitcodes.OK, exitcodes.FINDINGS), result.stderr[-2000:]
    validate_report(result.report)
    found = result.symptoms("ddp-ranks-diverged")
    assert len(found) == 1 and found[0]["severity"] == "error", result.report["symptoms"]
    values = found[0]["evidence"][0]["values"]
    assert values["diverged_at_step"] == 1 and values["first_unsynced_step"] == 1, values
    assert values["checksum_spread"] > 0
    assert found[0]["location"]["line"] == line_of("ddp_sync_off.py", text)


@pytest.mark.distributed
@pytest.mark.heavy  # a 2-rank torchrun (~10 s); the quick suite is at its 10-minute budget
def test_a_ddp_getter_used_only_for_saving_is_healthy(tmp_path_factory, validate_report):
    # the getter that returns model.module is read only for the final state_dict: training goes through the wrapper
    from tests.test_run_distributed import dist_run

    result = dist_run(tmp_path_factory, "sync-off-getter-save", "-p", "distributed", "--nproc-per-node", "2",
                      "ddp_sync_off.py", "--", "getter-save")
    assert result.returncode == exitcodes.OK, result.stderr[-2000:]
    validate_report(result.report)
    assert not result.symptoms("ddp-ranks-diverged"), result.report["symptoms"]


@pytest.mark.parametrize(("how", "text"), [
    ("constant", "adversarial = F.softplus(-disc(fake).detach()).mean()"),
    ("item", "adversarial = F.softplus(-disc(fake)).mean().detach().item()"),
    ("through", "adversarial = F.softplus(-disc(torch.cat([fake.detach()[:, :4], x[:, 4:]], 1))).mean()"),
])
def test_a_loss_term_cut_off_by_detach_is_non_differentiable_at_the_detach(tmp_path_factory, validate_report, how,
                                                                             text):
    result = shared_run(tmp_path_factory, f"detached-{how}", "detached_terms.py", "--fail-on", "never", "--", how)
    assert_sound(result, validate_report, exitcodes.OK)
    found = result.symptoms("non-differentiable")
    assert len(found) == 1 and found[0]["severity"] == "error", result.report["symptoms"]
    assert found[0]["location"]["line"] == line_of("detached_terms.py", text)
    values = found[0]["evidence"][0]["values"]
    assert values["parameters_reached"] == 4 and values["optimizer_parameters"] == 4, values  # the generator's
    # the diagnosis says what was measured: one term trains nothing, the rest of the loss still trains the generator
    (report,) = [r for r in result.report["reports"] if r["specialist"] == "autograd"]
    diagnosis, titles = report["diagnosis"], [f["title"] for f in report["fixes"]]
    assert "nothing upstream of the cut" not in diagnosis and "the 4 parameters" in diagnosis, diagnosis
    if how == "through":
        assert "through `" in diagnosis and titles[0].startswith("Detach only in the step"), (diagnosis, titles)
    else:
        assert "counts in the loss value" in diagnosis and titles[0] == "Compute the term from the attached tensor"


def test_the_number_item_gives_for_a_detached_value_is_a_float_to_the_script():
    import pickle

    import torch

    from torchdoctor.probes.detached import CutFloat, DetachedSummands

    watch = DetachedSummands(torch, lambda kind, **fields: None)
    model = torch.nn.Linear(3, 1)
    watch.arm()
    try:
        value = model(torch.randn(2, 3)).sum().detach().item()
        total = 1.0 + value
        assert isinstance(total, CutFloat) and total == 1.0 + float(value)
    finally:
        watch.disarm()
    assert torch.overrides._get_current_function_mode() is None  # the mode is gone with the watch
    again = total + 1.0
    assert type(again) is float and type(pickle.loads(pickle.dumps(total))) is float
    assert repr(total) == repr(float(total)) and hash(total) == hash(float(total))


def test_the_detached_watch_never_pops_a_mode_the_script_entered_after_it():
    import torch

    from torchdoctor.probes.detached import DetachedSummands

    watch = DetachedSummands(torch, lambda kind, **fields: None)
    watch.arm()
    device = torch.device("cpu")
    device.__enter__()  # `with torch.device(...)` opened by the script inside the watched iteration
    watch.disarm()
    inner = torch.overrides._get_current_function_mode()
    assert type(inner).__name__ == "DeviceContext"  # the script's mode is still the innermost
    assert (torch.ones(2) + 1).tolist() == [2.0, 2.0]  # ours, left below it, passes ops through
    device.__exit__(None, None, None)
    watch.tidy()  # the next optimizer step pops ours
    assert watch.mode is None and torch.overrides._get_current_function_mode() is None


@pytest.mark.distributed
@pytest.mark.heavy  # a 2-rank torchrun (~4 s); the quick suite was at 603 s on a clean clone of stop 26 (budget 600)
def test_a_parameter_replaced_after_ddp_wrapping_is_ranks_diverged_at_the_assignment(tmp_path_factory,
                                                                                     validate_report):
    from tests.test_run_distributed import dist_run

    result = dist_run(tmp_path_factory, "ddp-replaced", "-p", "distributed", "--nproc-per-node", "2",
                      "ddp_replaced_param.py")
    assert result.returncode in (exitcodes.OK, exitcodes.FINDINGS), result.stderr[-2000:]
    assert result.run["stopped"] == "completed", result.run  # the watch put Module.__setattr__ back (asserted)
    validate_report(result.report)
    found = result.symptoms("ddp-ranks-diverged")
    assert len(found) == 1, result.report["symptoms"]
    values = found[0]["evidence"][0]["values"]
    assert values["replaced_parameters"] == ["0.weight"] and values["checksum_spread"] > 0, values
    assert found[0]["location"]["line"] == line_of("ddp_replaced_param.py", "net[0].weight = ")


@pytest.mark.parametrize(("how", "text", "severity"), [
    # heavy: one more run (~6 s); the quick suite was at 603 s on a clean clone of stop 26 (budget 600)
    pytest.param("replaced", "optim.set_parameters(model.parameters())  # a new optimizer", "error",
                 marks=pytest.mark.heavy),
    ("never", 'model.load_state_dict(checkpoint["model"])', "warning"),
    # heavy: one more run (~4-8 s); the quick suite is at its budget
    pytest.param("handed", "optimizer = type(optimizer)(model.parameters()", "error", marks=pytest.mark.heavy),
    # heavy: one more run (~4-8 s); the optimizer's own file, read by a helper and dropped: that read is named
    pytest.param("separate", "state = torch.load(opt_path)", "warning", marks=pytest.mark.heavy),
    # heavy: one more run (~4-8 s); a trainer's fit() builds a fresh optimizer after its load() restored the weights
    pytest.param("trainer", "optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-3)  # built", "warning",
                 marks=pytest.mark.heavy),
])
def test_a_resume_whose_stepping_optimizer_starts_empty_is_named(tmp_path_factory, validate_report, how, text,
                                                                 severity):
    result = shared_run(tmp_path_factory, f"resume-optimizer-{how}", "resume_optimizer.py", "--fail-on", "never",
                        "--", how)
    assert_sound(result, validate_report, exitcodes.OK)
    found = result.symptoms("resume-optimizer-state-missing")
    assert len(found) == 1 and found[0]["severity"] == severity, result.report["symptoms"]
    assert found[0]["location"]["line"] == line_of("resume_optimizer.py", text)
    assert found[0]["evidence"][0]["values"]["how"] == ("replaced" if how in ("replaced", "handed") else "never-loaded")


@pytest.mark.parametrize(("how", "text"), [("layer", "torch.nn.Linear(16, 16),"),
                                           ("own", "return torch.log(x * 0)"),
                                           # heavy: one more run (~4-8 s); the quick suite is at its budget
                                           pytest.param("nested", "self.body = torch.nn.Sequential(",
                                                        marks=pytest.mark.heavy)])
def test_nan_made_inside_an_nn_sequential_names_a_line_of_the_script(tmp_path_factory, validate_report, how, text):
    # a torch layer called by the container: the line that built it; the script's own module: its forward's op
    result = shared_run(tmp_path_factory, f"nan-in-sequential-{how}", "nan_in_sequential.py", "--fail-on", "never",
                        "--", how)
    assert_sound(result, validate_report, exitcodes.OK)
    found = result.symptoms("nan-loss")
    assert len(found) == 1, result.report["symptoms"]
    assert found[0]["location"]["line"] == line_of("nan_in_sequential.py", text), found[0]
    assert ("built on line" in found[0]["evidence"][0]["summary"]) == (how != "own"), found[0]


# heavy: a torchdoctor run of a training script per case (~4-8 s); the quick suite is at its 10-minute budget
@pytest.mark.heavy
@pytest.mark.parametrize("how", ["bug", "healthy"])
def test_model_train_called_inside_a_validation_block_is_named_at_that_call(tmp_path_factory, validate_report, how):
    # model.eval() and then model.train() before the validation forwards: the train() call is the line to fix;
    # the healthy twin calls model.train() after the validation and draws nothing
    result = shared_run(tmp_path_factory, f"train-call-in-validation-{how}", "train_call_in_validation.py",
                        "--fail-on", "never", "--", how)
    assert_sound(result, validate_report, exitcodes.OK)
    found = result.symptoms("eval-mode-missing")
    if how == "healthy":
        assert diagnosed(result) == [], result.report["symptoms"]
        return
    assert len(found) == 1, result.report["symptoms"]
    line = line_of("train_call_in_validation.py", "            model.train()")
    assert found[0]["location"]["line"] == line, found[0]
    assert f"model.train() on line {line}" in found[0]["evidence"][0]["summary"], found[0]


# heavy: a torchdoctor run of a training script per case (~4-8 s); the quick suite is at its 10-minute budget
@pytest.mark.heavy
@pytest.mark.parametrize("how", ["bug", "healthy"])
def test_nan_made_in_the_scripts_own_loss_function_is_named_at_its_op(tmp_path_factory, validate_report, how):
    # the model's outputs are finite: the loss function (a plain function, no module) is replayed on the step's
    # own tensors and the 0/0 is named at its line; the guarded twin draws nothing and prints what it prints plain
    result = shared_run(tmp_path_factory, f"nan-in-loss-function-{how}", "nan_in_loss_function.py",
                        "--fail-on", "never", "--", how)
    assert_sound(result, validate_report, exitcodes.OK)
    assert "done 15" in result.stdout + result.stderr
    if how == "healthy":
        assert diagnosed(result) == [], result.report["symptoms"]
        return
    found = result.symptoms("nan-loss")
    assert len(found) == 1, result.report["symptoms"]
    assert found[0]["location"]["line"] == line_of("nan_in_loss_function.py", "spec = (empty * free).sum() / count")
    assert "in specificity_loss" in found[0]["evidence"][0]["summary"], found[0]


# heavy: a torchdoctor run of a training script per case (~4-8 s); the quick suite is at its 10-minute budget
@pytest.mark.heavy
@pytest.mark.parametrize("how", ["bug", "healthy"])
def test_losses_kept_on_a_callbacks_attribute_are_a_leak_named_in_its_class(tmp_path_factory, validate_report, how):
    # the trainer's frame holds the callbacks (objects of the script's own class); one level into their attributes
    # the list of graph-holding losses grows every step: named at the callback's `self.losses.append(...)`
    result = shared_run(tmp_path_factory, f"callback-keeps-losses-{how}", "callback_keeps_losses.py",
                        "--fail-on", "never", "--", how)
    assert_sound(result, validate_report, exitcodes.OK)
    found = result.symptoms("memory-growth")
    if how == "healthy":  # loss.item() per step is a host sync (info), nothing else
        assert not found and all(s["severity"] == "info" for s in result.report["symptoms"]), result.report["symptoms"]
        return
    assert len(found) == 1, result.report["symptoms"]
    assert found[0]["location"]["line"] == line_of("callback_keeps_losses.py", "self.losses.append("), found[0]
    assert ".losses" in found[0]["evidence"][0]["summary"], found[0]


def test_a_loss_function_replay_runs_only_on_copies_of_plain_arguments():
    # a function handed a module or an optimizer (an EMA update) could change them for good: never replayed;
    # tensors in tuples, lists and dicts are copied, so an in-place op of the replay leaves the script's alone
    import torch

    from torchdoctor.probes.nanlocate import _copied, _plain

    ema = torch.nn.Linear(2, 2)
    assert not _plain((ema, torch.ones(2)), torch)
    assert not _plain({"opt": torch.optim.SGD(ema.parameters(), lr=0.1)}, torch)
    pred, target = torch.ones(3), torch.zeros(3)
    args = (pred, [target, 2.0], {"weight": torch.ones(1), "name": "geo"}, None)
    assert _plain(args, torch)
    copies = _copied(args, torch)
    copies[0].mul_(0)
    copies[1][0].add_(5)
    assert pred.eq(1).all() and target.eq(0).all()
    assert copies[2]["name"] == "geo" and copies[1][1] == 2.0 and copies[3] is None


# heavy: a torchdoctor run of a training script per case (~4-8 s); the quick suite is at its 10-minute budget
@pytest.mark.heavy
@pytest.mark.parametrize("how", ["bug", "gradcache", "pseudo"])
def test_a_term_built_on_an_integer_copy_made_a_leaf_again_is_non_differentiable(tmp_path_factory, validate_report,
                                                                                  how):
    # an integer cast cuts the graph like detach(); through NumPy and back, made a leaf that requires grad, the
    # term reaches that leaf only: non-differentiable at the cast. GradCache reads the leaf's .grad and sends it
    # back by hand; pseudo-labels are a target: both quiet
    result = shared_run(tmp_path_factory, f"integer-cut-{how}", "integer_cut_term.py", "--fail-on", "never",
                        "--", how)
    assert_sound(result, validate_report, exitcodes.OK)
    found = result.symptoms("non-differentiable")
    if how != "bug":
        assert not found, found
        return
    assert len(found) == 1, result.report["symptoms"]
    assert found[0]["location"]["line"] == line_of("integer_cut_term.py", "rounded = out.int()"), found[0]
    assert found[0]["evidence"][0]["values"]["rebuilt_leaf"] is True, found[0]


def test_no_watch_mode_is_left_on_the_stack_after_its_steps(tmp_path_factory, validate_report):
    # the loss-function watch is disarmed inside backward(), where its mode is off the stack: it must still be
    # popped (at the optimizer step), or every later op pays a Python call (a 20-30 % slower step, measured)
    result = shared_run(tmp_path_factory, "mode-stack", "mode_stack.py", "--fail-on", "never")
    assert_sound(result, validate_report, exitcodes.OK)
    assert "modes []" in result.stdout + result.stderr, result.stderr[-2000:]


# heavy: a torchdoctor run of a training script per case (~4-8 s); the quick suite is at its 10-minute budget
@pytest.mark.heavy
@pytest.mark.parametrize("how", ["bug", "healthy"])
def test_a_batch_made_non_finite_by_the_datasets_code_is_named_at_its_op(tmp_path_factory, validate_report, how):
    # the batch reaches the model holding nan: the shuffled sampler's indices for that batch are fetched again and
    # the 0/0 of the script's transform is named, not the DataLoader's line; the guarded twin draws nothing
    result = shared_run(tmp_path_factory, f"nan-made-in-dataset-{how}", "nan_made_in_dataset.py",
                        "--fail-on", "never", "--", how)
    assert_sound(result, validate_report, exitcodes.OK)
    assert "done 1" in result.stdout + result.stderr
    if how == "healthy":
        # the twin is about the nan: timing symptoms (a data wait on a loaded machine) are not its question
        nan_ids = {"nonfinite-input", "nan-loss", "nonfinite-grad", "fp16-overflow"}
        assert not [s for s in diagnosed(result) if s["id"] in nan_ids], result.report["symptoms"]
        return
    found = result.symptoms("nonfinite-input")
    assert len(found) == 1, result.report["symptoms"]
    assert found[0]["location"]["line"] == line_of("nan_made_in_dataset.py", "return (color - lo) / span"), found[0]
    values = found[0]["evidence"][0]["values"]
    assert values["dataset"] == "Scans" and values["dataset_item"] % 5 == 3, values


def test_the_dataset_refetch_restores_the_random_states_and_skips_what_it_cannot_fetch():
    # the items of a batch are fetched again under the op check: a random augmentation's draws there must not
    # shift the script's own random streams, and an iterable dataset (no index) is never fetched
    import random

    import torch
    from torch.utils.data import IterableDataset

    from torchdoctor.probes.nanlocate import locate_in_dataset

    class Jitter(torch.utils.data.Dataset):
        def __getitem__(self, i):
            x = torch.rand(4) + random.random()
            return x / (x - x) if i == 2 else x

    torch.manual_seed(3)
    random.seed(3)
    made = locate_in_dataset(torch, Jitter(), [0, 1, 2, 3])
    assert made is not None and made["item"] == 2 and made["op"] == "Tensor.div", made
    assert made["line"] == next(n for n, text in enumerate(open(__file__).read().splitlines(), 1)
                                if "return x / (x - x)" in text)
    after = (torch.rand(1).item(), random.random())
    torch.manual_seed(3)
    random.seed(3)
    assert after == (torch.rand(1).item(), random.random())

    class Stream(IterableDataset):
        def __iter__(self):
            yield torch.zeros(1) / 0

    assert locate_in_dataset(torch, Stream(), [None]) is None
    assert locate_in_dataset(torch, Jitter(), [0, 1]) is None


# heavy: a torchdoctor run of a training script per case (~4-8 s); the quick suite is at its 10-minute budget
@pytest.mark.heavy
@pytest.mark.parametrize("how", ["bug", "healthy"])
def test_a_term_built_and_left_out_of_the_loss_is_named_where_it_was_last_used(tmp_path_factory, validate_report,
                                                                                 how):
    # the offset head runs with a graph and nothing detaches its output: its values are followed to the last op
    # that used them (the weighted total the helper then replaced), named next to the line that dropped it
    result = shared_run(tmp_path_factory, f"dropped-term-{how}", "dropped_term.py", "--fail-on", "never", "--", how)
    assert_sound(result, validate_report, exitcodes.OK)
    assert "done 11" in result.stdout + result.stderr
    found = result.symptoms("non-differentiable")
    if how == "healthy":
        assert not found and not result.symptoms("frozen-parameters"), result.report["symptoms"]
        return
    assert len(found) == 1, result.report["symptoms"]
    assert found[0]["location"]["line"] == line_of("dropped_term.py", "total = score_loss + 0.5"), found[0]
    values = found[0]["evidence"][0]["values"]
    assert values["modules"] == ["offset"] and values["dropped_op"] == "Tensor.add", values


# heavy: a torchdoctor run of a training script per case (~4-8 s); the quick suite is at its 10-minute budget
@pytest.mark.heavy
@pytest.mark.parametrize("how", ["bug", "restored", "frozen"])
def test_eval_mode_switched_on_inside_every_training_step_is_named_at_the_call(tmp_path_factory, validate_report,
                                                                               how):
    # the loss puts the model in train mode, then calls a helper whose model.eval() is still in force when the
    # step's training forward runs: named at the helper's call in the loss; a helper followed by model.train(),
    # and batch norm frozen once before training, are quiet
    result = shared_run(tmp_path_factory, f"eval-inside-step-{how}", "eval_inside_step.py", "--fail-on", "never",
                        "--", how)
    assert_sound(result, validate_report, exitcodes.OK)
    assert "done 11" in result.stdout + result.stderr
    found = [s for s in result.symptoms("eval-mode-missing") if s["evidence"][0]["kind"] == "probe"]
    if how != "bug":
        assert not found, found
        return
    assert len(found) == 1, result.report["symptoms"]
    assert found[0]["location"]["line"] == line_of("eval_inside_step.py", "positives = count_positives(model, x)")
    values = found[0]["evidence"][0]["values"]
    assert values["switched_in_step"] == 3 and values["train_not_restored"] is True, values


# heavy: a torchdoctor run of a Lightning script per case (~8-15 s); the quick suite is at its 10-minute budget
@pytest.mark.heavy
@pytest.mark.parametrize("how", ["bug", "healthy"])
def test_nan_made_in_a_loss_function_that_lightnings_training_step_calls_is_named(tmp_path_factory, validate_report,
                                                                                   how):
    # Lightning calls backward(): the user's frame above it is trainer.fit(...); the loss function is found among
    # the callees of training_step (user code that Lightning entered) and its 0/0 is named at its line
    pytest.importorskip("lightning", reason="lightning is an optional test extra")
    result = shared_run(tmp_path_factory, f"nan-in-lightning-loss-{how}", "nan_in_lightning_loss.py",
                        "--fail-on", "never", "--", how)
    assert_sound(result, validate_report, exitcodes.OK)
    assert "done 16" in result.stdout + result.stderr
    found = result.symptoms("nan-loss")
    if how == "healthy":
        assert not found, result.report["symptoms"]
        return
    assert len(found) == 1, result.report["symptoms"]
    assert found[0]["location"]["line"] == line_of("nan_in_lightning_loss.py", "return -torch.log((empty * free)")
    assert "in specificity_loss" in found[0]["evidence"][0]["summary"], found[0]


# heavy: a torchdoctor run of a Lightning script per case (~8-15 s); the quick suite is at its 10-minute budget
@pytest.mark.heavy
@pytest.mark.parametrize("how", ["bug", "healthy"])
def test_a_head_cut_off_in_lightnings_training_step_is_named_at_the_detach(tmp_path_factory, validate_report, how):
    # training_step runs the encoder and the heads as separate top-level calls: the head that gets no gradient runs
    # after the first one ends, and the cut sits in the loss code; both are watched until the backward
    pytest.importorskip("lightning", reason="lightning is an optional test extra")
    result = shared_run(tmp_path_factory, f"lightning-detached-head-{how}", "lightning_detached_head.py",
                        "--fail-on", "never", "--", how)
    assert_sound(result, validate_report, exitcodes.OK)
    assert "done 16" in result.stdout + result.stderr
    if how == "healthy":
        assert not result.symptoms("non-differentiable") and not result.symptoms("frozen-parameters"), \
            result.report["symptoms"]
        return
    assert not result.symptoms("frozen-parameters"), result.report["symptoms"]  # the aux head does run
    found = result.symptoms("non-differentiable")
    line = line_of("lightning_detached_head.py", "recon = recon.detach()")
    assert found and all(s["location"]["line"] == line for s in found), found
    assert any("at `.detach()`" in e["summary"] for s in found for e in s["evidence"]), found


# heavy: a torchdoctor run of a Hugging Face Trainer script (~15 s); the quick suite is at its 10-minute budget
@pytest.mark.heavy
def test_nan_made_in_a_loss_function_that_a_trainers_compute_loss_calls_is_named(tmp_path_factory, validate_report):
    # the Trainer's own code calls backward(): the loss function is found among compute_loss's callees
    pytest.importorskip("transformers", reason="transformers is an optional test extra")
    result = shared_run(tmp_path_factory, "nan-in-trainer-compute-loss", "nan_in_trainer_compute_loss.py",
                        "--fail-on", "never")
    assert_sound(result, validate_report, exitcodes.OK)
    found = result.symptoms("nan-loss")
    assert len(found) == 1, result.report["symptoms"]
    assert found[0]["location"]["line"] == line_of("nan_in_trainer_compute_loss.py", "return -(torch.log(p) * w)")


# heavy: a torchdoctor run of a training script per case (~4-8 s); the quick suite is at its 10-minute budget
@pytest.mark.heavy
@pytest.mark.parametrize("how", ["bug", "healthy"])
def test_a_generator_never_zeroed_is_missing_zero_grad_at_its_own_backward(tmp_path_factory, validate_report, how):
    # the discriminator's backward comes first after the generator's step and does not reach its gradients: the
    # backward named is the generator's, the one that adds into them; zeroed in place, the twin is quiet
    _bug_or_twin(tmp_path_factory, validate_report, "gan-missing-zero-grad", "gan_missing_zero_grad.py", how,
                 "done 39", "missing-zero-grad", "g_loss.backward()")


# heavy: a torchdoctor run of a training script per case (~4-8 s); the quick suite is at its 10-minute budget
@pytest.mark.heavy
@pytest.mark.parametrize("how", ["bug", "healthy"])
def test_a_nan_replay_leaves_batch_norm_statistics_the_step_saved_untouched(tmp_path_factory, validate_report, how):
    # the replay of a nan step ran the model's batch norm on its real running statistics, which the step's graph
    # had saved: the script's own loss.backward() then failed ("modified by an inplace operation") and the run
    # crashed where it completes plain; the replay now works on copies, and the script runs to its end
    _bug_or_twin(tmp_path_factory, validate_report, "nan-after-batchnorm", "nan_after_batchnorm.py", how, "done 20",
                 "nan-loss", "mean = points[:, :, :3].sum(")


# heavy: a torchdoctor run of a training script per case (~4-8 s); the quick suite is at its 10-minute budget
@pytest.mark.heavy
@pytest.mark.parametrize("how", ["bug", "healthy"])
def test_an_lbfgs_closure_that_never_zeroes_is_missing_zero_grad_at_its_backward(tmp_path_factory, validate_report,
                                                                                 how):
    # zero_grad() once before optimizer.step(closure): LBFGS moves the weights and evaluates the closure again, whose
    # backward adds into the previous evaluation's gradient; the twin sets the gradients to None inside the closure
    result, found = _bug_or_twin(tmp_path_factory, validate_report, "lbfgs-closure-unzeroed",
                                 "lbfgs_closure_unzeroed.py", how, "done 12", "missing-zero-grad", "loss.backward()")
    if found is None:
        assert not result.symptoms("zero-grad-every-micro-step"), result.report["symptoms"]
        return
    values = found["evidence"][0]["values"]
    assert values["closure"] is True and values["stale_steps"] == values["steps_checked"] == 12, values


# heavy: a torchdoctor run of a training script per case (~4-8 s); the quick suite is at its 10-minute budget
@pytest.mark.heavy
@pytest.mark.parametrize("how", ["bug", "healthy"])
def test_a_nan_target_made_by_a_helper_is_named_at_its_op_by_the_next_steps_watch(tmp_path_factory, validate_report,
                                                                                  how):
    # step 1's loss is nan while the model's outputs are finite, and nothing replayable made it: the next steps' ops
    # are watched, and the division that turns the depth map's zeros into inf is named; the clamped twin is quiet
    _, found = _bug_or_twin(tmp_path_factory, validate_report, "nan-in-target-helper", "nan_in_target_helper.py", how,
                            "done 16", "nan-loss", "return max_depth / depth")
    if found is not None:
        assert found["evidence"][0]["values"]["made_at_step"] > 1, found


def test_the_op_watch_names_the_first_op_making_a_nonfinite_value_and_leaves_no_mode():
    # asked-for infinities (a -inf fill value) and uninitialised memory are not made by the op; a 1/0 is
    import torch
    from torch.overrides import _get_current_function_mode

    from torchdoctor.probes.nanwatch import OpWatch

    found = []
    watch = OpWatch(torch, found.append)
    watch.arm(steps=2)
    x = torch.ones(4)
    x.masked_fill(x > 0, float("-inf"))
    torch.empty(1000)
    assert found == []
    y = torch.zeros(4)
    x / y  # the op
    assert len(found) == 1 and found[0]["op"].endswith("div") and found[0]["path"] == __file__, found
    watch.step_ended()
    assert watch.mode is None and _get_current_function_mode() is None


# heavy: a torchdoctor run of a training script per case (~4-8 s); the quick suite is at its 10-minute budget
@pytest.mark.heavy
@pytest.mark.parametrize("how", ["bug", "healthy"])
def test_a_loss_term_made_from_an_argmax_mask_is_non_differentiable_at_the_argmax(tmp_path_factory, validate_report,
                                                                                  how):
    # the edge term of a loss module is built on pred.argmax(1).float(): a constant added to the cross-entropy
    # (mobile-hair-segmentation #3); the twin uses the soft probability, and an argmax accuracy it only prints
    _, found = _bug_or_twin(tmp_path_factory, validate_report, "argmax-cut-loss-term", "argmax_cut_loss_term.py", how,
                            "done 12", "non-differentiable", "mask = logits.argmax(1, keepdim=True).float()")
    if found is not None:
        assert found["evidence"][0]["values"]["cut"] == "argmax()", found
        assert "`argmax()` on line" in found["evidence"][0]["summary"], found


# heavy: a torchdoctor run of a training script per case (~4-8 s); the quick suite is at its 10-minute budget
@pytest.mark.heavy
@pytest.mark.parametrize("how", ["bug", "healthy"])
def test_a_checkpoint_helper_saving_the_scheduler_but_not_the_optimizer_is_incomplete(tmp_path_factory,
                                                                                       validate_report, how):
    # weights.pt and scheduler.pt per save, never loaded by the script: the scheduler's state says it is meant for a
    # resume (OneVision-Encoder #65); the twin also writes optimizer.pt
    _, found = _bug_or_twin(tmp_path_factory, validate_report, "checkpoint-helper-no-optimizer",
                            "checkpoint_helper_without_optimizer.py", how, "done 30", "checkpoint-incomplete",
                            'torch.save(model.state_dict(), os.path.join(target, "weights.pt"))')
    if found is not None:
        assert "optimizer" in found["evidence"][0]["values"]["missing"], found


# heavy: a torchdoctor run of a training script per case (~4-8 s); the quick suite is at its 10-minute budget
@pytest.mark.heavy
@pytest.mark.parametrize("how", ["bug", "healthy"])
def test_a_graph_grown_in_place_on_a_stats_objects_tensor_is_named_at_the_add(tmp_path_factory, validate_report,
                                                                              how):
    # stats.device_stat("average_loss").add_(loss) in the loop (DeepLearningExamples #1102): the line that grows the
    # object's tensor, not the class line that made it; the twin adds loss.detach()
    _bug_or_twin(tmp_path_factory, validate_report, "stats-object-add-in-place", "stats_object_add_in_place.py", how,
                 "done 60", "memory-growth", 'stats.device_stat("average_loss").add_(')


# heavy: a torchdoctor run of a training script per case (~4-8 s); the quick suite is at its 10-minute budget
@pytest.mark.heavy
@pytest.mark.parametrize("how", ["bug", "healthy"])
def test_an_optimizer_loaded_through_its_own_empty_state_dict_is_named_at_that_load(tmp_path_factory, validate_report,
                                                                                    how):
    # load_state_dict(keep_known(optimizer.state_dict(), saved)) keeps none of the saved moments (KempnerForge #115):
    # the load ran, so the diagnosis says it ran empty, at that line; the twin loads the saved state
    _, found = _bug_or_twin(tmp_path_factory, validate_report, "resume-empty-template",
                            "resume_through_empty_template.py", how, "done 10", "resume-optimizer-state-missing",
                            "optimizer.load_state_dict(keep_known(")
    if found is not None:
        assert found["evidence"][0]["values"]["how"] == "loaded-empty", found
        assert "was handed a state dict with no per-parameter state" in found["evidence"][0]["summary"], found


@pytest.mark.heavy  # a torchdoctor run (~5 s); the quick suite is at its 10-minute budget
def test_a_checkpoint_written_before_any_step_loaded_empty_is_no_lost_state(tmp_path_factory, validate_report):
    # the same template load of a checkpoint whose optimizer never stepped: nothing was lost, nothing is said (it
    # read as "no optimizer's load_state_dict ran" before)
    result = shared_run(tmp_path_factory, "resume-empty-template-fresh", "resume_through_empty_template.py",
                        "--fail-on", "never", "--", "fresh")
    assert_sound(result, validate_report, exitcodes.OK)
    assert "done 10" in result.stdout + result.stderr
    assert not result.symptoms("resume-optimizer-state-missing"), result.report["symptoms"]


@pytest.mark.heavy  # a training run per case (~5 s each); the quick suite is at its 10-minute budget
@pytest.mark.parametrize("how", ["bug", "healthy"])
def test_a_test_pass_through_model_forward_is_named_at_the_call_of_forward(tmp_path_factory, validate_report, how):
    # BERT-pytorch: `self.model.forward(x)` runs no Module.__call__, so the first module called was the model's own
    # `self.body(x)`: the evaluation was sited inside the model's forward, not at the trainer's line
    _bug_or_twin(tmp_path_factory, validate_report, "forward-called-directly", "forward_called_directly.py", how,
                 "done", "eval-without-no-grad", "out = self.model.forward(x)")


@pytest.mark.heavy  # a training run per case (~4 s each); the quick suite is at its 10-minute budget
@pytest.mark.parametrize("how", ["bug", "healthy"])
def test_a_scheduler_also_stepped_by_the_test_epoch_is_scheduler_granularity(tmp_path_factory, validate_report, how):
    # PALAVRA: run_epoch() ends with scheduler.step() and runs the test epoch too, so the schedule advances twice
    # per epoch; the twin steps it after training epochs only
    _, found = _bug_or_twin(tmp_path_factory, validate_report, "scheduler-in-test-epoch",
                            "scheduler_in_test_epoch.py", how, "done", "scheduler-granularity", "        scheduler.step()")
    if found is not None:
        values = found["evidence"][0]["values"]
        assert values["idle_steps"] == 8 and values["stepped_per"] == "phase", values


@pytest.mark.heavy  # a training run per case (~4 s each); the quick suite is at its 10-minute budget
@pytest.mark.parametrize("how", ["bug", "healthy"])
def test_a_weights_checkpoint_with_an_extra_entry_is_judged_as_weights(tmp_path_factory, validate_report, how):
    # Pytorch-UNet: state_dict['mask_values'] = ... made the saved dict no longer "all tensors", so the save held
    # nothing recognisable and the weights-only checkpoint went unjudged; the twin saves the optimizer beside it
    _, found = _bug_or_twin(tmp_path_factory, validate_report, "weights-with-extras", "weights_with_extras_checkpoint.py",
                            how, "done", "checkpoint-incomplete", "torch.save(state_dict,")
    if found is not None:
        values = found["evidence"][0]["values"]
        assert "model" in values["saved"] and "optimizer" in values["missing"], values


@pytest.mark.heavy  # a training run per case (~4 s each); the quick suite is at its 10-minute budget
@pytest.mark.parametrize("how", ["bug", "healthy"])
def test_a_nan_made_inline_in_the_loss_is_named_from_the_loss_graph(tmp_path_factory, validate_report, how):
    # TRL's GRPO loss: `... / mask.sum()` with an all-zero mask is 0/0; its nan gradients reach the weights in the
    # same step, so no later op has finite inputs for the op watch: the bad loss's own graph names the division
    _, found = _bug_or_twin(tmp_path_factory, validate_report, "nan-inline-division", "nan_inline_division.py", how,
                            "done", "nan-loss", "loss = (per_item * mask).sum() / denominator")
    if found is not None:
        assert found["evidence"][0]["values"]["made_op"] == "Div", found["evidence"][0]


@pytest.mark.heavy  # a training run per case (~4 s each); the quick suite is at its 10-minute budget
@pytest.mark.parametrize("how", ["module", "function", "healthy"])
def test_a_nan_gradient_made_by_a_loss_is_named_at_its_op(tmp_path_factory, validate_report, how):
    # siamese-triplet's ContrastiveLoss, mmrotate's GWD loss: sqrt of a distance that is exactly 0 is finite forward
    # and infinite backward. The backward replay ran the loss on the real step's prediction, whose graph the step's
    # own backward had freed ("backward through the graph a second time"), and named nothing; it now cuts a
    # replayed call's inputs into leaves and runs loss functions with grad too
    line = {"module": "return distance.sqrt().mean()", "function": "return dist.sqrt().mean()"}.get(how, "")
    result, found = _bug_or_twin(tmp_path_factory, validate_report, "nan-grad-sqrt-loss", "nan_grad_sqrt_loss.py", how,
                                 "done", "nonfinite-grad", line)
    if found is not None:
        assert found["location"]["function"] == ("forward" if how == "module" else "pair_distance"), found
        assert found["evidence"][0]["values"].get("op") == "Tensor.sqrt", found["evidence"][0]


@pytest.mark.heavy  # a training run per case (~4 s each); the quick suite is at its 10-minute budget
@pytest.mark.parametrize("how", ["bug", "healthy", "epoch-decay"])
def test_a_lambda_schedule_sized_in_steps_but_stepped_per_epoch_is_scheduler_granularity(tmp_path_factory,
                                                                                       validate_report, how):
    # stable-worldmodel: a warm-up + cosine LambdaLR over max_epochs * len(train) steps, stepped per epoch by
    # Lightning's "interval": "epoch". A lambda has no length to read; where its replayed curve ends is one
    result = shared_run(tmp_path_factory, f"lambda-sized-in-steps-{how}", "lambda_sized_in_steps.py", "--fail-on",
                        "never", "--", how)
    assert_sound(result, validate_report, exitcodes.OK)
    assert "done" in result.stdout + result.stderr
    found = result.symptoms("scheduler-granularity")
    if how != "bug":
        assert not found, found
        return
    assert len(found) == 1, result.report["symptoms"]
    assert found[0]["location"]["line"] == line_of("lambda_sized_in_steps.py", 'if how != "healthy":') + 1, found[0]
    values = found[0]["evidence"][0]["values"]
    assert values["total_steps"] == 192 and values["steps_taken"] == 6, values
    assert values["length_from"] == "the replayed lambda curve", values


@pytest.mark.heavy  # a training run per case (~4 s each); the quick suite is at its 10-minute budget
@pytest.mark.parametrize("how", ["bug", "healthy"])
def test_a_loss_averaged_through_torch_tensor_is_named_at_that_constructor(tmp_path_factory, validate_report, how):
    # predrnn: torch.mean(torch.tensor(decouple_loss)) copies the terms' values into a tensor with no graph; no
    # Tensor method cuts it, so the cut was named at the script's backward (where a probe read the loss's value)
    _, found = _bug_or_twin(tmp_path_factory, validate_report, "tensor-of-losses", "tensor_of_losses.py", how, "done",
                            "non-differentiable", "aux = torch.mean(torch.tensor(terms))")
    if found is not None:
        assert found["evidence"][0]["values"]["op"] == "torch.tensor(...)", found["evidence"][0]


@pytest.mark.heavy  # a training run per case (~4 s each); the quick suite is at its 10-minute budget
@pytest.mark.parametrize("how", ["bug", "healthy"])
def test_metric_pairs_kept_in_a_dict_of_lists_are_named_where_a_helper_appends_them(tmp_path_factory,
                                                                                    validate_report, how):
    # lambeq's Trainer: `eval_results[metr].append((batch_size, res))` into the trainer's dict of lists, handed to
    # the helper as a parameter; the scan saw neither the (n, tensor) pairs nor which name the dict grows under
    _, found = _bug_or_twin(tmp_path_factory, validate_report, "metric-pairs-in-dict", "metric_pairs_in_dict.py", how,
                            "done", "memory-growth", "results[name].append((len(x), value))")
    if found is not None:
        assert found["location"]["function"] == "step_and_eval", found["location"]


@pytest.mark.heavy  # a training run per case (~4 s each); the quick suite is at its 10-minute budget
@pytest.mark.parametrize("how", ["trainer", "registry", "healthy"])
def test_a_meter_fed_loss_tensors_through_dicts_is_named_where_it_sums(tmp_path_factory, validate_report, how):
    # pytracking's trainer.stats[loader][name].update(val) and fairseq's metrics aggregators: the holder scan looked
    # one level into objects and never through a dict (or a class-level registry) to the meter's running sum
    _, found = _bug_or_twin(tmp_path_factory, validate_report, f"meters-in-registry-{how}", "meters_in_registry.py",
                            "healthy" if how == "healthy" else how, "done", "memory-growth", "self.sum += val * n")
    if found is not None:
        variable = found["evidence"][0]["values"]["variable"]
        assert variable.endswith(".sum") and ("['loss']" in variable), variable


@pytest.mark.heavy  # a training run per case (~4 s each); the quick suite is at its 10-minute budget
@pytest.mark.parametrize("how", ["bug", "healthy"])
def test_a_nan_made_by_a_masked_mean_below_a_loss_object_is_named_at_the_division_that_ran(tmp_path_factory,
                                                                                           validate_report, how):
    # NeMo RL's ClippedPGLossFn: both terms go through masked_mean's 0/0, so the bad loss's graph forks (the walk
    # gave up), and the division sits in a helper of the loss object's __call__, with a second, unused one
    _, found = _bug_or_twin(tmp_path_factory, validate_report, "nan-masked-mean", "nan_masked_mean_helper.py", how,
                            "done", "nan-loss", "return (values * mask).sum() / total")
    if found is not None:
        assert found["evidence"][0]["values"]["made_op"] == "Div", found["evidence"][0]


@pytest.mark.heavy  # a training run per case (~4 s each); the quick suite is at its 10-minute budget
@pytest.mark.parametrize("how", ["bug", "finetune", "full"])
def test_a_resume_from_a_weights_only_checkpoint_the_run_writes_again_is_named_at_the_restore(tmp_path_factory,
                                                                                             validate_report, how):
    # svbrdf-estimation, HowToTrainYourMAML: the checkpoint never held the optimizer; the run reads it, trains with
    # a fresh Adam and writes it again. A fine-tune reads pretrained weights the run never writes: silent.
    result = shared_run(tmp_path_factory, f"resume-weights-only-{how}", "resume_weights_only.py",
                        "--fail-on", "never", "--", how)
    assert_sound(result, validate_report, exitcodes.OK)
    assert "done" in result.stdout + result.stderr
    found = result.symptoms("resume-optimizer-state-missing")
    if how != "bug":
        assert not found, result.report["symptoms"]
        return
    assert len(found) == 1 and found[0]["severity"] == "warning", result.report["symptoms"]
    assert found[0]["location"]["line"] == line_of("resume_weights_only.py", "model.load_state_dict(checkpoint)")
    assert found[0]["evidence"][0]["values"]["how"] == "not-saved", found[0]["evidence"][0]


@pytest.mark.distributed
@pytest.mark.heavy  # a 2-rank torchrun per case (~6-10 s); the quick suite is at its 10-minute budget
@pytest.mark.parametrize(("how", "text"), [("kept", "loss = criterion(net(x), y)"),
                                           ("head", "loss = criterion(model(x), y)"),
                                           ("healthy", None)])
def test_a_forward_around_every_ddp_wrapper_is_named_at_its_call(tmp_path_factory, validate_report, how, text):
    # no `.module` read: the model's reference kept from before wrapping, or a loss module with its own weights
    # never wrapped; a frozen teacher and an EMA copy run outside the wrapper by design and stay silent
    from tests.test_run_distributed import dist_run

    result = dist_run(tmp_path_factory, f"ddp-bypass-{how}", "-p", "distributed", "--nproc-per-node", "2",
                      "ddp_bypass.py", "--", how)
    assert result.returncode in (exitcodes.OK, exitcodes.FINDINGS), result.stderr[-2000:]
    validate_report(result.report)
    assert result.run["steps_completed"] == 10
    found = result.symptoms("ddp-ranks-diverged")
    if text is None:
        assert not found, result.report["symptoms"]
        return
    assert len(found) == 1 and found[0]["severity"] == "error", result.report["symptoms"]
    assert found[0]["location"]["line"] == line_of("ddp_bypass.py", text), found[0]


@pytest.mark.heavy  # a training run per case (~4 s each); the quick suite is at its 10-minute budget
@pytest.mark.parametrize("how", ["spent", "twice", "noam-epoch", "healthy", "warmup-only", "noam-step",
                                 "epoch-warmup"])
def test_a_schedule_read_from_its_curve_is_judged_by_its_warmup_and_where_it_is_spent(tmp_path_factory,
                                                                                    validate_report, how):
    # Lightning #18570 (a LambdaLR sized in epochs, stepped per batch), transformers #26827 (stepped twice per
    # optimizer step), coqui-ai/TTS #1611 (the script's own NoamLR, warm-up in steps, stepped per epoch)
    result = shared_run(tmp_path_factory, f"schedule-from-curve-{how}", "schedule_from_curve.py", "--fail-on",
                        "never", "--", how)
    assert_sound(result, validate_report, exitcodes.OK)
    assert "done" in result.stdout + result.stderr
    found = result.symptoms("scheduler-granularity")
    if how not in ("spent", "twice", "noam-epoch"):
        assert not found, found
        return
    assert len(found) == 1, result.report["symptoms"]
    values = found[0]["evidence"][0]["values"]
    if how == "noam-epoch":
        assert found[0]["location"]["line"] == line_of("schedule_from_curve.py", "if per_epoch:") + 1, found[0]
        assert values["scheduler"] == "WarmupRsqrt" and values["total_steps"] == 100, values
        assert values["length_from"] == "the replayed warm-up" and values["steps_taken"] == 8, values
        built = [e for e in found[0]["evidence"] if "was built here" in e["summary"]]
        assert built and built[0]["location"]["line"] == line_of("schedule_from_curve.py",
                                                                 "scheduler = WarmupRsqrt("), built
        return
    assert found[0]["location"]["line"] == line_of("schedule_from_curve.py", "scheduler.step()"), found[0]
    # under 1% of the peak from step 8 of 160 (spent), from step 159 of 320 (twice: 2 per optimizer step)
    assert values["lr_final"] == 0 and values["total_steps"] == (8 if how == "spent" else 159), values
    assert values["spent_share"] == (0.95 if how == "spent" else 0.503), values


@pytest.mark.heavy  # a Lightning run per case
@pytest.mark.parametrize("how", ["bug", "healthy"])
def test_a_lightning_interval_outside_the_scheduler_dict_is_named_at_that_key(tmp_path_factory, validate_report,
                                                                              how):
    pytest.importorskip("lightning", reason="lightning is an optional test extra")
    _bug_or_twin(tmp_path_factory, validate_report, "lightning-interval-key", "lightning_interval_key.py", how,
                 "done", "scheduler-granularity", '"interval": "step"}')


@pytest.mark.heavy  # a training run per case (~4 s each)
@pytest.mark.parametrize("how", ["rollout", "healthy", "frozen", "freeze-helper"])
def test_a_model_left_in_eval_mode_by_a_rollout_before_its_first_update_is_not_restored(tmp_path_factory,
                                                                                      validate_report, how):
    # OpenRLHF #118: make_experience() puts the actor in eval mode and the PPO updates never call train(); a
    # script that trains in eval mode on purpose switches it itself (frozen batch norm) and stays silent
    result = shared_run(tmp_path_factory, f"eval-routine-left-eval-{how}", "eval_routine_left_eval.py",
                        "--fail-on", "never", "--", how)
    assert_sound(result, validate_report, exitcodes.OK)
    assert "done" in result.stdout + result.stderr
    found = result.symptoms("eval-mode-missing")
    if how != "rollout":
        assert not found, found
        return
    assert len(found) == 1, result.report["symptoms"]
    assert found[0]["location"]["line"] == line_of("eval_routine_left_eval.py", "actions = rollout(states)"), found[0]
    assert found[0]["evidence"][0]["values"]["never_in_train_mode"] is True


@pytest.mark.heavy  # a training run per case (~4 s each)
@pytest.mark.parametrize("how", ["bug", "measured", "healthy"])
def test_an_evaluation_through_the_training_steps_backward_is_backward_in_validation(tmp_path_factory,
                                                                                    validate_report, how):
    # Arctic-Platform #88: eval_nll() measures the test loss through forward_backward (never in eval mode) and the
    # next step applies those gradients; a deliberate test-gradient measurement zeroes them and stays silent
    result = shared_run(tmp_path_factory, f"backward-elsewhere-{how}", "backward_elsewhere.py", "--fail-on", "never",
                        "--", how)
    assert_sound(result, validate_report, exitcodes.OK)
    assert "done" in result.stdout + result.stderr
    found = result.symptoms("backward-in-validation")
    if how != "bug":
        assert not found, found
        return
    assert len(found) == 1, result.report["symptoms"]
    assert found[0]["location"]["line"] == line_of("backward_elsewhere.py", "total = sum(forward_backward(x, y)")
    values = found[0]["evidence"][0]["values"]
    assert values["windows"] == 6 and values["usual_micro_steps"] == 1 and values["function"] == "eval_nll", values


@pytest.mark.heavy  # a training run per case, each resuming from a checkpoint an earlier process writes (~5 s each)
@pytest.mark.parametrize(("how", "where", "also"), [
    # NAS-Bench-201 #19: the optimizer comes back, the MultiStepLR built before the restore counts from zero
    ("fresh", 'optimizer.load_state_dict(checkpoint["optimizer"])', "MultiStepLR(optimizer, milestones=[3, 6]"),
    # pytorch-gradual-warmup-lr #27: the restored scheduler's follow-up drives the optimizer copy pickled with it
    ("stale", 'scheduler.load_state_dict(checkpoint["scheduler"])', "scheduler = Warmup(optimizer, 2, after)"),
    ("restored", None, None),
    ("last-epoch", None, None),
    ("positioned", None, None),
    ("stale-fixed", None, None),
])
def test_a_resume_whose_schedule_does_not_come_back_with_the_optimizer_is_named(tmp_path_factory, validate_report,
                                                                                 how, where, also):
    result = shared_run(tmp_path_factory, f"resume-scheduler-{how}", "resume_scheduler.py", "--fail-on", "never",
                        "--", how)
    assert_sound(result, validate_report, exitcodes.OK)
    assert f"resumed {how}" in result.stdout + result.stderr
    found = result.symptoms("resume-optimizer-state-missing")
    if where is None:
        assert not found, found  # restored, built with last_epoch, or placed with step(epoch): the schedule goes on
        return
    assert len(found) == 1 and found[0]["severity"] == "warning", result.report["symptoms"]
    assert found[0]["location"]["line"] == line_of("resume_scheduler.py", where), found[0]
    lines = [(e.get("location") or {}).get("line") for e in found[0]["evidence"]]
    assert lines[1:] == [line_of("resume_scheduler.py", also)], found[0]
    assert found[0]["evidence"][0]["values"]["how"] == f"scheduler-{how}"


@pytest.mark.heavy  # a training run per case, each resuming from a checkpoint an earlier process writes (~5 s each)
@pytest.mark.parametrize("how", ["bug", "healthy", "pretrained"])
def test_a_resume_that_takes_the_pickled_model_back_whole_is_judged_like_a_weights_restore(tmp_path_factory,
                                                                                          validate_report, how):
    # `model = torch.load(path)["model"]` restores the weights as load_state_dict does: a fresh optimizer that never
    # gets the checkpoint's state is the same empty resume; a fine-tune from a pretrained pickle stays silent
    result = shared_run(tmp_path_factory, f"resume-whole-model-{how}", "resume_whole_model.py", "--fail-on", "never",
                        "--", how)
    assert_sound(result, validate_report, exitcodes.OK)
    assert f"resumed {how}" in result.stdout + result.stderr
    found = result.symptoms("resume-optimizer-state-missing")
    if how != "bug":
        assert not found, found
        return
    assert len(found) == 1, result.report["symptoms"]
    assert found[0]["location"]["line"] == line_of("resume_whole_model.py", "checkpoint = torch.load(path"), found[0]
    assert found[0]["evidence"][0]["values"]["how"] == "never-loaded"


@pytest.mark.heavy  # a training run per case (~4 s each)
@pytest.mark.parametrize("how", ["bug", "guarded", "measure", "adapt"])
def test_a_phase_loop_that_steps_in_its_validation_phase_is_backward_in_validation(tmp_path_factory,
                                                                                   validate_report, how):
    # pose-ae-train #11: one helper runs zero_grad/backward/step for `phase in ["train", "valid"]`, never in eval
    # mode; the guarded loop, a gradient measured and zeroed in the val phase, and a test-time adaptation with its
    # own optimizer stay silent
    result = shared_run(tmp_path_factory, f"phase-loop-{how}", "phase_loop_backward.py", "--fail-on", "never",
                        "--", how)
    assert_sound(result, validate_report, exitcodes.OK)
    assert f"done {how}" in result.stdout + result.stderr
    found = result.symptoms("backward-in-validation")
    if how != "bug":
        assert not found, found
        return
    assert len(found) == 1, result.report["symptoms"]
    assert found[0]["location"]["line"] == line_of("phase_loop_backward.py", "loss.backward()"), found[0]
    values = found[0]["evidence"][0]["values"]
    assert values["phase_variable"] == "phase" and values["phase"] == "val" and values["windows"] >= 2, values


@pytest.mark.heavy  # a training run per case (~3 s each)
@pytest.mark.parametrize("how", ["bug", "stepped", "sequential", "plateau"])
def test_a_scheduler_that_is_never_stepped_is_named_where_it_was_built(tmp_path_factory, validate_report, how):
    # cp-vton-plus #69: the LambdaLR decay is built and never stepped; stepped, chained in a SequentialLR (whose
    # parts it steps) or a plateau scheduler stepped per epoch stay silent
    result = shared_run(tmp_path_factory, f"scheduler-never-stepped-{how}", "scheduler_never_stepped.py",
                        "--fail-on", "never", "--", how)
    assert_sound(result, validate_report, exitcodes.OK)
    assert f"done {how}" in result.stdout + result.stderr
    found = result.symptoms("scheduler-never-stepped")
    if how != "bug":
        assert not found, found
        return
    assert len(found) == 1 and found[0]["severity"] == "warning", result.report["symptoms"]
    assert found[0]["location"]["line"] == line_of("scheduler_never_stepped.py", "scheduler = lr_scheduler.LambdaLR")
    values = found[0]["evidence"][0]["values"]
    assert values["scheduler"] == "LambdaLR" and values["optimizer_steps"] == 30, values


@pytest.mark.distributed
@pytest.mark.heavy  # a 2-rank torchrun per case (~6-10 s); the quick suite is at its 10-minute budget
@pytest.mark.parametrize(("how", "text"), [("passed", "return self._loss(unwrapped, x, y)"),
                                           ("local-rule", "self.linear.weight.data.add_(delta, alpha=0.05)"),
                                           ("healthy", None)])
def test_replicas_drifting_through_a_passed_module_or_a_local_update_are_named_there(tmp_path_factory,
                                                                                   validate_report, how, text):
    # "passed": the helper that runs the forward received the unwrapped module: the call that hands it down is named,
    # not the helper's forward; "local-rule": a parameter written in place inside the DDP forward from each rank's own
    # batch (the written parameter joins the checksum, which samples a few parameters across the model); the
    # healthy twin passes the wrapper, all-reduces its local update and clamps in place, the same on every rank
    from tests.test_run_distributed import dist_run

    result = dist_run(tmp_path_factory, f"ddp-local-{how}", "-p", "distributed", "--nproc-per-node", "2",
                      "ddp_local_update.py", "--", how)
    _assert_divergence_named_at(result, validate_report, "ddp_local_update.py", text)


def _assert_divergence_named_at(result, validate_report, script: str, text: str | None) -> None:
    """A 2-rank run of `script` completed its 10 steps; the replicas' drift is one error named at the line holding
    `text`, or, for a healthy twin (`text` None), not reported at all."""
    assert result.returncode in (exitcodes.OK, exitcodes.FINDINGS), result.stderr[-2000:]
    validate_report(result.report)
    assert result.run["steps_completed"] == 10
    found = result.symptoms("ddp-ranks-diverged")
    if text is None:
        assert not found, result.report["symptoms"]
        return
    assert len(found) == 1 and found[0]["severity"] == "error", result.report["symptoms"]
    assert found[0]["location"]["line"] == line_of(script, text), found[0]


@pytest.mark.heavy  # a training run per case (~4 s each); the quick suite is at its 10-minute budget
@pytest.mark.parametrize("how", ["bug", "once", "healthy"])
def test_a_nonfinite_constant_of_inline_loss_code_is_named_where_it_was_made(tmp_path_factory, validate_report, how):
    # advantages normalised by a one-sample minibatch's std: a tensor outside autograd, made inline, with no model
    # forward recorded (the policy's layers run from its own method); "bug" repeats, so the next steps' op watch
    # names `std`; "once" happens at the last update only, and the frame's non-finite local names its assignment
    result = shared_run(tmp_path_factory, f"nan-constant-{how}", "nan_constant_inline.py", "--fail-on", "never",
                        "--", how)
    assert_sound(result, validate_report, exitcodes.OK)
    assert "done 3" in result.stdout + result.stderr
    found = result.symptoms("nan-loss")
    if how == "healthy":
        assert not found and not result.symptoms("nonfinite-grad"), result.report["symptoms"]
        return
    assert len(found) == 1, result.report["symptoms"]
    assert found[0]["location"]["line"] == line_of("nan_constant_inline.py",
                                                   "advantages = advantages / (advantages.std() + 1e-8)"), found[0]


@pytest.mark.heavy  # a training run per case (~4 s each); the quick suite is at its 10-minute budget
@pytest.mark.parametrize("how", ["bug", "healthy"])
def test_a_log_of_zero_inline_with_no_model_call_recorded_is_named_at_the_log(tmp_path_factory, validate_report,
                                                                             how):
    # the policy's layers run from its `act` method, so no model call is recorded and nothing can be replayed: the
    # bad loss's own graph shows `Log` making the NaN, at the one line of the loop's code that writes it
    result = shared_run(tmp_path_factory, f"nan-policy-method-{how}", "nan_policy_method.py", "--fail-on", "never",
                        "--", how)
    assert_sound(result, validate_report, exitcodes.OK)
    assert "done 5" in result.stdout + result.stderr
    found = result.symptoms("nan-loss")
    if how == "healthy":
        assert not found and not result.symptoms("nonfinite-grad"), result.report["symptoms"]
        return
    assert len(found) == 1, result.report["symptoms"]
    assert found[0]["location"]["line"] == line_of("nan_policy_method.py",
                                                   "entropy = -(probs * torch.log(probs)).sum(-1).mean()"), found[0]


@pytest.mark.heavy  # a training run per case (~4 s each)
@pytest.mark.parametrize("how", ["bug", "healthy", "detached-head"])
def test_gradients_left_by_another_optimizers_loss_are_missing_zero_grad_at_the_backward(tmp_path_factory,
                                                                                         validate_report, how):
    # the generator's loss fills the discriminator's gradients and its backward adds into them (Lightning #557);
    # twins: each optimizer cleared before its own backward; an actor-critic and a shared loss stepped twice
    script = "gradients_left_across_steps.py"
    result = shared_run(tmp_path_factory, f"left-across-steps-{how}", script, "--fail-on", "never", "--", how)
    assert_sound(result, validate_report, exitcodes.OK)
    assert "done" in result.stdout + result.stderr
    found = result.symptoms("missing-zero-grad")
    if how != "bug":
        assert not found, result.report["symptoms"]
        return
    assert len(found) == 1 and found[0]["severity"] == "error", result.report["symptoms"]
    assert found[0]["location"]["line"] == line_of(script, "        loss.backward()"), found[0]["location"]
    assert found[0]["evidence"][0]["values"]["across_steps"] is True, found[0]["evidence"][0]


@pytest.mark.heavy  # a training run per case (~4 s each)
@pytest.mark.parametrize("how", ["bug", "full", "best", "snapshots"])
def test_a_checkpoint_named_only_where_it_is_written_is_judged_as_one(tmp_path_factory, validate_report, how):
    # {'step', 'model'} every 8 steps into checkpoints/step=N.pth, no resume path in the script (bytesep #20);
    # twins: the optimizer and scheduler saved too, a best-model export, plain weight snapshots
    script = "checkpoint_named_where_written.py"
    result = shared_run(tmp_path_factory, f"ckpt-named-{how}", script, "--fail-on", "never", "--", how)
    assert_sound(result, validate_report, exitcodes.OK)
    assert "done" in result.stdout + result.stderr
    found = result.symptoms("checkpoint-incomplete")
    if how != "bug":
        assert not found, result.report["symptoms"]
        return
    assert len(found) == 1, result.report["symptoms"]
    assert found[0]["location"]["line"] == line_of(script, "torch.save(checkpoint, checkpoint_path)")
    assert {"optimizer", "scheduler"} <= set(found[0]["evidence"][0]["values"]["missing"]), found[0]["evidence"][0]


@pytest.mark.heavy  # a training run per case (~4 s each)
@pytest.mark.parametrize(("how", "text"), [("forwarder", "        save_on_master(checkpoint, "),
                                           ("named", "    torch.save(state, path)"),
                                           ("full", None)])
def test_an_incomplete_checkpoint_through_a_forwarding_helper_is_named_where_it_is_handed_over(
        tmp_path_factory, validate_report, how, text):
    # save_on_master(*args, **kwargs) only forwards (pytorch/vision#4923): the caller's line; a helper that names
    # the state keeps its own torch.save; a complete dict stays silent
    script = "checkpoint_through_forwarder.py"
    result = shared_run(tmp_path_factory, f"ckpt-forwarder-{how}", script, "--fail-on", "never", "--", how)
    assert_sound(result, validate_report, exitcodes.OK)
    assert "done" in result.stdout + result.stderr
    found = result.symptoms("checkpoint-incomplete")
    if text is None:
        assert not found, result.report["symptoms"]
        return
    assert len(found) == 1, result.report["symptoms"]
    assert found[0]["location"]["line"] == line_of(script, text), found[0]["location"]


def _resume_warning(tmp_path_factory, validate_report, name: str, script: str, how: str,
                    healthy: bool) -> dict | None:
    """Run `script` (an earlier job, then the resume) with `how`; the one `resume-optimizer-state-missing` warning it
    raised, or None for a healthy twin, which must raise none."""
    result = shared_run(tmp_path_factory, f"{name}-{how}", script, "--fail-on", "never", "--", how)
    assert_sound(result, validate_report, exitcodes.OK)
    assert f"resumed {how}" in result.stdout + result.stderr
    found = result.symptoms("resume-optimizer-state-missing")
    if healthy:
        assert not found, result.report["symptoms"]
        return None
    assert len(found) == 1 and found[0]["severity"] == "warning", result.report["symptoms"]
    return found[0]


@pytest.mark.heavy  # a training run per case after an earlier job in its own process (~6 s each)
@pytest.mark.parametrize(("how", "where"), [("optimizer", "if self.load_optimizer:"),
                                            ("scheduler", "if self.load_scheduler:"),
                                            ("healthy", None)])
def test_a_restore_that_a_condition_skipped_is_named_at_the_condition(tmp_path_factory, validate_report, how, where):
    # verl #7953: the restore code reads the checkpoint and keeps a load_state_dict behind a flag that is off; the
    # line to change is that condition, not the weights' (or the optimizer's) restore a few lines above it
    found = _resume_warning(tmp_path_factory, validate_report, "resume-skipped", "resume_skipped_restore.py", how,
                            healthy=where is None)
    if found is None:
        return
    assert found["location"]["line"] == line_of("resume_skipped_restore.py", where), found
    assert "was skipped" in found["evidence"][0]["summary"], found["evidence"][0]


@pytest.mark.heavy  # a training run per case after an earlier job in its own process (~6 s each)
@pytest.mark.parametrize("how", ["bug", "healthy", "rebuilt"])
def test_a_gradscaler_restored_and_then_replaced_is_named_where_the_new_one_is_built(tmp_path_factory,
                                                                                    validate_report, how):
    # the continued run starts again at the initial loss scale and skips the overflowing steps on the way down; a
    # scaler rebuilt in a run that restored nothing, or the restored one kept, stays silent
    found = _resume_warning(tmp_path_factory, validate_report, "resume-scaler", "resume_scaler_replaced.py", how,
                            healthy=how != "bug")
    if found is None:
        return
    built_again = line_of("resume_scaler_replaced.py", "            self.scaler = torch.amp.GradScaler")  # in train()
    lines = [e["location"]["line"] for e in found["evidence"] if e["kind"] != "static"]
    assert lines == [built_again, line_of("resume_scaler_replaced.py", 'self.scaler.load_state_dict(state["scaler"])')]
    # check's TD709 reads the same rebuild from the code: its evidence, merged in, names the same line
    assert all(e["location"]["line"] == built_again for e in found["evidence"] if e["kind"] == "static"), found
    assert found["evidence"][0]["values"]["how"] == "scaler-replaced", found["evidence"][0]


@pytest.mark.heavy  # a training run per case after an earlier job in its own process (~6 s each)
@pytest.mark.parametrize("how", ["bug", "healthy", "vocab"])
def test_a_resume_that_reads_its_own_checkpoint_and_restores_nothing_is_named_at_the_read(tmp_path_factory,
                                                                                         validate_report, how):
    # Flow-Factory #172 (accelerate's load_state before prepare): the state is read before the objects it fills
    # are registered, so only the step comes back; the run then writes the same file next to the optimizer's state.
    # A fresh run that reads a vocabulary from its output folder stays silent.
    found = _resume_warning(tmp_path_factory, validate_report, "resume-unrestored", "resume_unrestored.py", how,
                            healthy=how != "bug")
    if found is None:
        return
    assert found["location"]["line"] == line_of("resume_unrestored.py", 'self.step = torch.load(os.path.join('), found
    assert found["evidence"][0]["values"]["how"] == "unrestored", found["evidence"][0]


@pytest.mark.parametrize("how", ["module", pytest.param("optimizer", marks=pytest.mark.heavy), "healthy",
                                 pytest.param("discarded", marks=pytest.mark.heavy)])
def test_an_evaluation_step_is_judged_whichever_other_zero_grad_runs_before_it(tmp_path_factory, validate_report,
                                                                               how):
    # a GAN's evaluation backpropagates D's loss in eval mode and steps optimizerD; a zero_grad() of the generator
    # (its module or its optimizer) in between clears none of D's gradients, so that step still applies them
    result = shared_run(tmp_path_factory, f"eval-steps-other-zero-grad-{how}", "eval_steps_other_zero_grad.py",
                        "--fail-on", "never", "--", how)
    assert_sound(result, validate_report, exitcodes.OK)
    assert "gan evaluation done" in result.stdout + result.stderr
    found = result.symptoms("backward-in-validation")
    if how in ("healthy", "discarded"):  # no backward, or D's own zero_grad() threw its gradients away
        assert not found, result.report["symptoms"]
        return
    assert len(found) == 1, result.report["symptoms"]
    assert found[0]["location"]["line"] == line_of("eval_steps_other_zero_grad.py", "        held_loss.backward()")
    assert found[0]["evidence"][0]["values"]["eval_mode_forwards"] >= 2, found[0]


@pytest.mark.heavy  # Lightning's import and trainer (~8 s a run)
@pytest.mark.parametrize("how", ["bug", "healthy"])
def test_eval_mode_left_by_a_framework_callback_is_named_at_its_eval_call(tmp_path_factory, validate_report, how):
    # the training step and the callback are both reached through the script's one `trainer.fit(...)` line: that
    # line ran no evaluation of its own, the callback's pl_module.eval() is where model.train() belongs after
    result = shared_run(tmp_path_factory, f"eval-framework-callback-{how}", "eval_left_by_framework_callback.py",
                        "--fail-on", "never", "--", how)
    assert_sound(result, validate_report, exitcodes.OK)
    assert "lightning callback done" in result.stdout + result.stderr
    found = result.symptoms("eval-mode-missing")
    if how == "healthy":
        assert not found, result.report["symptoms"]
        return
    assert len(found) == 1, result.report["symptoms"]
    line = line_of("eval_left_by_framework_callback.py", "            pl_module.eval()")
    assert found[0]["location"]["line"] == line, found[0]["location"]
    assert f"after the model.eval() of line {line}" in found[0]["evidence"][0]["summary"]


@pytest.mark.parametrize("how", ["dataparallel", pytest.param("own", marks=pytest.mark.heavy), "steps", "healthy"])
def test_an_evaluation_of_the_model_a_wrapper_trains_is_judged_as_that_model(tmp_path_factory, validate_report, how):
    # training through nn.DataParallel (or a wrapper of the script's own), evaluation handed `model.module`, first
    # called bare after the first step: the same parameters, so the same model for eval mode and its updates
    result = shared_run(tmp_path_factory, f"eval-inner-of-wrapper-{how}", "eval_inner_of_wrapper.py",
                        "--fail-on", "never", "--", how)
    assert_sound(result, validate_report, exitcodes.OK)
    assert "wrapped evaluation done" in result.stdout + result.stderr
    left = result.symptoms("eval-mode-missing")
    stepped = result.symptoms("backward-in-validation")
    if how == "healthy":
        assert not left and not stepped, result.report["symptoms"]
        return
    if how == "steps":
        assert len(stepped) == 1 and not left, result.report["symptoms"]
        line = line_of("eval_inner_of_wrapper.py", "            F.cross_entropy(m(x), y).backward()")
        assert stepped[0]["location"]["line"] == line, stepped[0]
        return
    assert len(left) == 1 and not stepped, result.report["symptoms"]
    line = line_of("eval_inner_of_wrapper.py", "    score = evaluate(model.module)")
    assert left[0]["location"]["line"] == line, left[0]["location"]


@pytest.mark.parametrize("how", ["bug", "healthy", pytest.param("freeze", marks=pytest.mark.heavy)])
def test_eval_mode_left_by_an_evaluation_of_a_submodule_is_named_at_its_call(tmp_path_factory, validate_report, how):
    # the monitor runs model.encoder(x) only, a call the forward watch does not see: the routine that called
    # model.eval() ran modules and returned, and training went on in eval mode; a helper that only switches the
    # mode (training in eval mode on purpose) runs nothing itself
    result = shared_run(tmp_path_factory, f"eval-submodule-monitor-{how}", "eval_submodule_monitor.py",
                        "--fail-on", "never", "--", how)
    assert_sound(result, validate_report, exitcodes.OK)
    assert "monitor done" in result.stdout + result.stderr
    found = result.symptoms("eval-mode-missing")
    if how != "bug":
        assert not found, result.report["symptoms"]
        return
    assert len(found) == 1, result.report["symptoms"]
    line = line_of("eval_submodule_monitor.py", "        monitored = knn_monitor(model, data[:3])")
    assert found[0]["location"]["line"] == line, found[0]["location"]


@pytest.mark.distributed
@pytest.mark.heavy  # a 2-rank torchrun per case (~10 s); the quick suite is at its 10-minute budget
@pytest.mark.parametrize(("how", "text"), [
    ("clip-rank0", "torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)"),
    ("reset", "layer.weight[quiet] = torch.randn("),
    ("healthy", None),
])
def test_an_in_place_write_outside_the_ddp_forward_that_drifts_the_replicas_is_named(tmp_path_factory,
                                                                                    validate_report, how, text):
    # gradients all-reduced, then a rank-local write: a clip under the main-process branch (a gradient written
    # on one rank only), a dead-unit reset of a middle layer from each rank's own generator (a parameter written
    # from rank-local values); the first and last parameters stay equal in the reset case. The healthy twin clips
    # on every rank and resets from all-reduced activations with a shared generator: the same writes, no drift.
    from tests.test_run_distributed import dist_run

    result = dist_run(tmp_path_factory, f"ddp-outside-write-{how}", "-p", "distributed", "--nproc-per-node", "2",
                      "ddp_outside_write.py", "--", how)
    _assert_divergence_named_at(result, validate_report, "ddp_outside_write.py", text)


@pytest.mark.heavy  # a training run per case (~4 s each); the quick suite is at its 10-minute budget
@pytest.mark.parametrize(("how", "text"), [
    ("nograd", "with torch.no_grad():"),
    ("data", "self.conv.weight.data[:, 0] = built"),
    ("healthy", None),
])
def test_parameters_cut_inside_the_model_are_named_where_the_graph_was_cut(tmp_path_factory, validate_report, how,
                                                                          text):
    # the module owning the parameters runs, but reads them with autograd off (a constraint's no_grad inside the
    # forward: the `with` line is named) or writes a kernel built from them through `.data` (the write is named);
    # before, the first read as "never ran in the forward" with no line and the second named the loss. The healthy
    # twin keeps both in the graph and runs a frozen teacher and a weight clamp under no_grad.
    result = shared_run(tmp_path_factory, f"param-cut-{how}", "param_cut_inside.py", "--fail-on", "never", "--", how)
    assert_sound(result, validate_report, exitcodes.OK)
    assert "done 8" in result.stdout + result.stderr
    found = result.symptoms("non-differentiable")
    if text is None:
        assert not found and not result.symptoms("frozen-parameters"), result.report["symptoms"]
        return
    assert len(found) == 1, result.report["symptoms"]
    assert found[0]["location"]["line"] == line_of("param_cut_inside.py", text), found[0]
    assert not result.symptoms("frozen-parameters"), result.report["symptoms"]


@pytest.mark.heavy  # a training run per case (~4 s each); the quick suite is at its 10-minute budget
@pytest.mark.parametrize(("how", "symptom", "text"), [
    ("entropy", "nan-loss", "return -(torch.exp(logp) * logp).sum(-1)"),
    ("distance", "nonfinite-grad", "return torch.sqrt(squared.clamp(min=1e-12) if how"),
    ("healthy", None, None),
])
def test_a_nonfinite_value_made_in_a_helper_of_the_loss_code_is_named_there(tmp_path_factory, validate_report, how,
                                                                            symptom, text):
    # "entropy": 0 * -inf of a masked entropy at the first step, in a helper the trainer's loss method calls (the
    # -inf mask is intended: the product is named, not the log-softmax); "distance": a sqrt at 0 in a method, NaN
    # only in the backward (the op with the singular derivative is named). Both before any step ran under watch.
    result = shared_run(tmp_path_factory, f"nan-helper-{how}", "nan_helper_first_step.py", "--fail-on", "never",
                        "--", how)
    assert_sound(result, validate_report, exitcodes.OK)
    assert "done 6" in result.stdout + result.stderr
    if symptom is None:
        assert not result.symptoms("nan-loss") and not result.symptoms("nonfinite-grad"), result.report["symptoms"]
        return
    found = result.symptoms(symptom)
    assert len(found) == 1, result.report["symptoms"]
    assert found[0]["location"]["line"] == line_of("nan_helper_first_step.py", text), found[0]


@pytest.mark.heavy  # two jobs in one training run per case (~5 s each)
@pytest.mark.parametrize(("how", "where"), [("full", '    if how.endswith("healthy"):'),
                                            ("series", '        model.load_state_dict(torch.load(os.path.join('),
                                            ("copied", '    if how.endswith("healthy"):'),
                                            ("healthy", None), ("finetune", None), ("target", None), ("best", None),
                                            ("copied-healthy", None), ("teacher", None)])
def test_a_resume_inside_the_run_is_judged_at_the_next_step(tmp_path_factory, validate_report, how, where):
    # run14a states 1 and 2: a first job writes its checkpoint and a later job in the same process reads it back into
    # a new model and optimizer; the resume was judged only at the run's first step, long gone. A fine-tune from the
    # run's own pretraining, a target network's copy and the best weights read back into the training model stay
    # silent. Weights copied into the parameters (no load_state_dict, state 4) are found there at the next step; a
    # teacher that took them is not the model that steps. (The optimizer restore sits behind the healthy twins' switch: named at that condition.)
    found = _resume_warning(tmp_path_factory, validate_report, "resume-midrun", "resume_midrun.py", how,
                            healthy=where is None)
    if found is None:
        return
    assert found["location"]["line"] == line_of("resume_midrun.py", where), found
    assert found["evidence"][0]["values"]["how"] == ("not-saved" if how == "series" else "never-loaded"), found


@pytest.mark.heavy  # a training run per case after an earlier job in its own process (~6 s each)
@pytest.mark.parametrize(("how", "where"), [("epoch", '    model.load_state_dict(checkpoint["model"])'),
                                            ("folder", '    model.load_state_dict(torch.load(os.path.join(folder,'),
                                            ("safetensors", '    model.load_state_dict(load_file(os.path.join('),
                                            ("healthy", None), ("pretrained", None), ("hub", None), ("st-hub", None)])
def test_a_resume_from_an_earlier_runs_file_without_optimizer_state_is_named(tmp_path_factory, validate_report, how,
                                                                             where):
    # run14a state 3: no save in the probed run, so "this run writes that checkpoint again" cannot tell a resume from
    # a fine-tune; the file's training position read as `args.resume`, or an optimizer file beside the weights that
    # nobody read (a safetensors read counts as one), can. A fine-tune from a pretrained file that holds an epoch, or
    # from a model folder, stays silent.
    found = _resume_warning(tmp_path_factory, validate_report, "resume-earlier", "resume_earlier_position.py", how,
                            healthy=where is None)
    if found is None:
        return
    assert found["location"]["line"] == line_of("resume_earlier_position.py", where), found
    assert found["evidence"][0]["values"]["how"] == "not-saved", found


@pytest.mark.parametrize("how", ["dataclass", "nested", "healthy"])
def test_forwards_whose_outputs_are_nested_or_a_dataclass_are_classified(tmp_path_factory, validate_report, how):
    # the output's tensors sit in a dataclass or a tuple inside a tuple: the forwards were classified as none of
    # trained / evaluation with grad / without grad, so neither evaluation mistake could be judged
    result = shared_run(tmp_path_factory, f"eval-nested-outputs-{how}", "eval_nested_outputs.py",
                        "--fail-on", "never", "--", how)
    assert_sound(result, validate_report, exitcodes.OK)
    assert "nested outputs done" in result.stdout + result.stderr
    measured = result.report["run"]["measurements"]["validation"]
    assert measured["trained"] == 32, measured
    with_grad, left = result.symptoms("eval-without-no-grad"), result.symptoms("eval-mode-missing")
    if how == "healthy":
        assert not with_grad and not left, result.report["symptoms"]
        return
    if how == "dataclass":
        assert len(with_grad) == 1 and not left, result.report["symptoms"]
        assert with_grad[0]["location"]["line"] == line_of("eval_nested_outputs.py", "            out = model(x)")
        return
    assert len(left) == 1 and not with_grad, result.report["symptoms"]
    assert left[0]["location"]["line"] == line_of("eval_nested_outputs.py", "    score = validate(model, val)")


@pytest.mark.parametrize("how", ["manual", "saliency", "bug"])
def test_forwards_reached_by_torch_autograd_grad_are_not_evaluations_with_grad(tmp_path_factory, validate_report, how):
    # torch.autograd.grad is a backward the backward watch does not see: training by `p.grad = g` and saliency maps
    # of the inputs were evaluations that built a graph for nothing (eval-without-no-grad on a healthy script)
    result = shared_run(tmp_path_factory, f"grads-by-autograd-grad-{how}", "grads_by_autograd_grad.py",
                        "--fail-on", "never", "--", how)
    assert_sound(result, validate_report, exitcodes.OK)
    assert "gradients done" in result.stdout + result.stderr
    found = result.symptoms("eval-without-no-grad")
    if how != "bug":
        assert not found, result.report["symptoms"]
        assert result.report["run"]["measurements"]["validation"]["eval_grad"] == 0
        return
    assert len(found) == 1, result.report["symptoms"]
    assert found[0]["location"]["line"] == line_of("grads_by_autograd_grad.py",
                                                   "            accuracy = (net(torch.randn(16, 8))")
    assert result.report["run"]["measurements"]["validation"]["eval_grad"] == 9


@pytest.mark.parametrize("how", ["bug", "cleared", "healthy"])
def test_optimizer_steps_in_an_evaluation_loop_without_backward_are_backward_in_validation(tmp_path_factory,
                                                                                          validate_report, how):
    # the forwards of the evaluation are reached by no backward, yet the optimizer steps after each: it re-applies
    # the gradients the last training batch left (no forward was trained in eval mode, so nothing else judged it)
    result = shared_run(tmp_path_factory, f"eval-steps-without-backward-{how}", "eval_steps_without_backward.py",
                        "--fail-on", "never", "--", how)
    assert_sound(result, validate_report, exitcodes.OK)
    assert "steps without backward done" in result.stdout + result.stderr
    stepped = result.symptoms("backward-in-validation")
    if how != "bug":
        assert not stepped, result.report["symptoms"]
        return
    assert len(stepped) == 1, result.report["symptoms"]
    assert stepped[0]["location"]["line"] == line_of("eval_steps_without_backward.py", "optimizer.step()  # kept")


@pytest.mark.parametrize(("how", "call"), [("phase", "        val_loss = runner.run(val, training=False)"),
                                           ("decorated", "        val_loss = runner.evaluate(val)"),
                                           ("inline", "        runner.model.eval()"),
                                           ("healthy", None)])
def test_eval_mode_left_through_a_function_both_paths_call_is_named_at_the_evaluation_call(
        tmp_path_factory, validate_report, how, call):
    # the training and the evaluation forwards both pass through one function (a run() for both phases, a
    # decorator's wrapper): the paths part where their lines differ, so the evaluation's call is named, not the
    # model.eval() inside the routine; an inline model.eval() before the training's own loss helper is named itself
    result = shared_run(tmp_path_factory, f"eval-left-by-shared-function-{how}", "eval_left_by_shared_function.py",
                        "--fail-on", "never", "--", how)
    assert_sound(result, validate_report, exitcodes.OK)
    assert "shared function done" in result.stdout + result.stderr
    left = result.symptoms("eval-mode-missing")
    if call is None:
        assert not left, result.report["symptoms"]
        return
    assert len(left) == 1, result.report["symptoms"]
    assert left[0]["location"]["line"] == line_of("eval_left_by_shared_function.py", call), left[0]["location"]


@pytest.mark.heavy  # a training run per case (~4 s each)
@pytest.mark.parametrize("how", ["submodule", "grad-list", "unused-ends", "second-optimizer", "whole", "parts",
                                 "second-optimizer-zeroed", "accumulate"])
def test_a_zero_grad_that_misses_some_stepped_gradients_is_missing_zero_grad(tmp_path_factory, validate_report, how):
    # run15miss state 1: each watched gradient is judged on its own (a submodule's zero_grad, a grad = None list
    # without the head), watched gradients are spread over the optimizer's parameters (its ends get none), and a
    # second optimizer stepping right after the first is checked only after a backward; twins clear it all
    bug = how in ("submodule", "grad-list", "unused-ends", "second-optimizer")
    _bug_or_twin(tmp_path_factory, validate_report, "zero-grad-elsewhere", "zero_grad_elsewhere.py", how, "done",
                 "missing-zero-grad", "loss.backward()  # the backward", bug=bug)


@pytest.mark.heavy  # a training run per case (~4 s each)
@pytest.mark.parametrize("how", ["shared", "flag", "nograd", "zip", "saliency"])
def test_optimizer_steps_on_a_validation_loaders_batches_are_backward_in_validation(tmp_path_factory,
                                                                                     validate_report, how):
    # run15miss state 2: the data probe counts, per loader, the optimizer steps that followed a backward on its
    # latest batch; a loader holding a validation/test split (train=False; the names it is built from) stepped on
    # while another loader is trained on is backward-in-validation, named at the evaluation's own line
    line = "# the evaluation's call" if how == "shared" else "# the test backward"
    _bug_or_twin(tmp_path_factory, validate_report, "eval-loader", "steps_on_eval_loader.py", how, "done",
                 "backward-in-validation", line, bug=how in ("shared", "flag"))


@pytest.mark.heavy  # a training run per case (~4 s each)
@pytest.mark.parametrize("how", ["periodic", "short", "detached", "window", "bounded"])
def test_graphs_kept_across_steps_at_a_slow_pace_or_in_a_short_run_are_memory_growth(tmp_path_factory,
                                                                                    validate_report, how):
    # run15miss state 3: a container's tensors that carry a graph are counted from the second step and judged at
    # one every 20 steps (3 at least), not at the 0.5 a step of detached values; twins: detached outputs, a
    # window of micro-batch losses dropped at each step, a bounded deque
    _bug_or_twin(tmp_path_factory, validate_report, "graphs-kept", "graphs_kept_slowly.py", how, "done",
                 "memory-growth", "# the kept graph", bug=how in ("periodic", "short"))


@pytest.mark.heavy  # a training run per case (~4 s each)
@pytest.mark.parametrize("how", ["with", "decorated", "target", "logging", "baseline", "selfdistill"])
def test_a_loss_term_computed_under_no_grad_is_a_cut_off_summand(tmp_path_factory, validate_report, how):
    # run15miss state 4: an op under torch.no_grad() on a tensor with a graph cuts its result from that graph as
    # detach() does; added to the loss as a constant it is named at the no_grad that turned autograd off; twins:
    # no_grad values used as targets, logged, in a product, as soft labels
    line = "# the no_grad block" if how == "with" else "# the decorator"
    _bug_or_twin(tmp_path_factory, validate_report, "no-grad-term", "loss_term_under_no_grad.py", how, "done",
                 "non-differentiable", line, bug=how in ("with", "decorated"))


@pytest.mark.distributed
@pytest.mark.heavy  # a 2-rank torchrun per case (~10 s each under load); the quick suite is at its budget
@pytest.mark.parametrize(("how", "text", "said"), [
    ("data-rank0", "                p.data.mul_(0.999)", "through `.data` on rank 0 only"),
    ("sched-rank0", "            scheduler.step()", "scheduler stepped a different number of times"),
    ("nosync-helper", "        return model.no_sync()", "calls `no_sync()`"),
    ("flag-helper", "    model.require_backward_grad_sync = micro ==", "turns `require_backward_grad_sync` off"),
    ("healthy", None, None)])
def test_ddp_replicas_drifting_through_a_rank_local_change_are_named_at_its_line(tmp_path_factory, validate_report,
                                                                                  how, text, said):
    # DDP all-reduces gradients only: a `.data` write on rank 0, a scheduler stepped on rank 0 and a `no_sync()`
    # chosen for every micro-batch leave the replicas apart; the line named is the rank-local change, not the
    # backward or "something else" with no line
    from tests.test_run_distributed import dist_run

    result = dist_run(tmp_path_factory, f"rank-local-{how}", "-p", "distributed,schedule", "--nproc-per-node", "2",
                      "ddp_rank_local.py", "--", how)
    assert result.returncode in (exitcodes.OK, exitcodes.FINDINGS), result.stderr[-2000:]
    validate_report(result.report)
    found = result.symptoms("ddp-ranks-diverged")
    if text is None:
        assert not found, result.report["symptoms"]
        return
    assert len(found) == 1, result.report["symptoms"]
    assert said in found[0]["evidence"][0]["summary"], found[0]["evidence"][0]["summary"]
    assert found[0]["location"]["line"] == line_of("ddp_rank_local.py", text), found[0]["location"]


@pytest.mark.heavy  # a torchdoctor run of a training script per case (~4-8 s); the quick suite is at its budget
@pytest.mark.parametrize("how", ["where", "healthy"])
def test_nan_gradient_from_a_discarded_where_branch_is_named_at_the_op(tmp_path_factory, validate_report, how):
    # the loss is finite (torch.where dropped the branch's -inf) and only the gradient is NaN: no replay reproduces
    # it, so the last backward's graph names the log below the where, found in the loss helper by name
    _, found = _bug_or_twin(tmp_path_factory, validate_report, "nan-masked-branch", "nan_masked_branch.py", how,
                            "done", "nonfinite-grad",
                            "    plogp = torch.where(mask, probs * torch.log(safe), torch.zeros_like(probs))")
    if found is not None:
        assert "in a branch of a `torch.where`" in found["evidence"][0]["summary"]


@pytest.mark.heavy  # a torchdoctor run of a training script per case (~4-8 s); the quick suite is at its budget
@pytest.mark.parametrize("how", ["inf", "healthy"])
def test_a_loss_that_stays_inf_is_diagnosed_without_an_internal_error(tmp_path_factory, validate_report, how):
    # a constant +inf loss also reads as "not decreasing", whose advice computed exp(loss) and raised OverflowError:
    # the whole report fell back to "torchdoctor failed to diagnose this run"
    result, found = _bug_or_twin(tmp_path_factory, validate_report, "inf-loss-constant", "inf_loss_constant.py", how,
                                 "done", "nan-loss", "        -(target * torch.log(p)).mean()")
    assert "internal error" not in result.stderr
    assert not any("failed to diagnose" in n for n in result.report.get("notes", []))


@pytest.mark.heavy  # a torchdoctor run of a training script per case (~4-8 s); the quick suite is at its budget
@pytest.mark.parametrize("how", ["leak", "healthy"])
def test_a_meter_attribute_that_chains_graphs_is_named_at_its_own_line(tmp_path_factory, validate_report, how):
    # the holder is `self.meter.total`; the in-place search through the file for `self` found the meter's unrelated
    # `self.count += 1` (another object's self) before the meter's own growing line
    _bug_or_twin(tmp_path_factory, validate_report, "meter-graph", "meter_graph.py", how, "done", "memory-growth",
                 "        self.total = self.total + value * n")


@pytest.mark.heavy  # a torchdoctor run of a training script per case (~4-8 s); the quick suite is at its budget
@pytest.mark.parametrize("how", ["imported", "healthy"])
def test_log_of_zero_in_a_loss_helper_imported_from_the_project_is_named_there(tmp_path_factory, validate_report,
                                                                               how):
    # non-finite at step 1 only (the weights are NaN after it): the graph shows a Log, and the helper that writes
    # it is in the project's own module, not the script: the search follows `from nan_losses_pkg.dice import ...`
    result = shared_run(tmp_path_factory, f"nan-imported-loss-{how}", "nan_imported_loss.py", "--fail-on", "never",
                        "--", how)
    assert_sound(result, validate_report, exitcodes.OK)
    assert "done" in result.stdout + result.stderr
    found = result.symptoms("nan-loss")
    if how == "healthy":
        assert not found, result.report["symptoms"]
        return
    assert len(found) == 1, result.report["symptoms"]
    assert found[0]["location"]["path"].endswith("dice.py"), found[0]["location"]
    assert found[0]["location"]["line"] == line_of("nan_losses_pkg/dice.py", "return -torch.log("), found[0]


@pytest.mark.distributed
@pytest.mark.heavy  # a 2-rank torchrun per case (~10 s each under load); the quick suite is at its budget
@pytest.mark.parametrize("how", ["late", "healthy"])
def test_a_harmless_first_module_read_is_not_named_for_the_forward_that_bypasses_ddp(tmp_path_factory,
                                                                                     validate_report, how):
    # `.module` is read first for a parameter count, then the step helper calls `model.module(x)`: the read on
    # the bypassing call's line is named, not the first read
    from tests.test_run_distributed import dist_run

    result = dist_run(tmp_path_factory, f"unwrap-late-{how}", "-p", "distributed", "--nproc-per-node", "2",
                      "ddp_unwrap_late.py", "--", how)
    assert result.returncode in (exitcodes.OK, exitcodes.FINDINGS), result.stderr[-2000:]
    validate_report(result.report)
    found = result.symptoms("ddp-ranks-diverged")
    if how == "healthy":
        assert not found, result.report["symptoms"]
        return
    assert len(found) == 1, result.report["symptoms"]
    assert found[0]["location"]["line"] == line_of("ddp_unwrap_late.py", "out = model.module(x) if"), found[0]
