# Source: https://github.com/AntreasAntoniou/HowToTrainYourMAMLPytorch/issues/31
# Original: AntreasAntoniou/HowToTrainYourMAMLPytorch few_shot_learning_system.py (MAMLFewShotClassifier.__init__,
# meta_update, run_train_iter, save_model, load_model) and experiment_builder.py (ExperimentBuilder.__init__,
# save_models, run_experiment), read at 2ba9314 (the parent of df8a94c, the fix)
# Bug: continue_from_epoch='latest' restores the network and the experiment state (current_iter) from
# train_model_latest, but save_model never writes the outer-loop Adam's state and load_model never restores it: the
# resumed run steps the Adam built in __init__ with empty moments.
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F
import torch.optim as optim
from torch import nn

torch.manual_seed(0)


class Args:
    meta_learning_rate = 1e-3
    min_learning_rate = 1e-5
    total_epochs = 6
    total_iter_per_epoch = 20
    continue_from_epoch = "latest"


class MAMLFewShotClassifier(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.args = args
        self.current_epoch = 0
        self.classifier = nn.Sequential(nn.Linear(28, 64), nn.ReLU(), nn.Linear(64, 5))
        self.optimizer = optim.Adam(self.trainable_parameters(), lr=args.meta_learning_rate, amsgrad=False)
        self.scheduler = optim.lr_scheduler.CosineAnnealingLR(optimizer=self.optimizer, T_max=self.args.total_epochs,
                                                              eta_min=self.args.min_learning_rate)

    def trainable_parameters(self):
        for param in self.parameters():
            if param.requires_grad:
                yield param

    def forward(self, data_batch, epoch):
        x_target_set, y_target_set = data_batch
        preds = self.classifier(x_target_set)
        loss = F.cross_entropy(preds, y_target_set)
        return {"loss": loss, "accuracy": (preds.argmax(1) == y_target_set).float().mean().item()}, preds

    def meta_update(self, loss):
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()

    def run_train_iter(self, data_batch, epoch):
        epoch = int(epoch)
        self.scheduler.step(epoch=epoch)
        if self.current_epoch != epoch:
            self.current_epoch = epoch
        if not self.training:
            self.train()
        losses, per_task_target_preds = self.forward(data_batch=data_batch, epoch=epoch)
        self.meta_update(loss=losses["loss"])
        losses["learning_rate"] = self.scheduler.get_last_lr()[0]
        return losses, per_task_target_preds

    def save_model(self, model_save_dir, state):
        state["network"] = self.state_dict()
        torch.save(state, f=model_save_dir)

    def load_model(self, model_save_dir, model_name, model_idx):
        filepath = os.path.join(model_save_dir, f"{model_name}_{model_idx}")
        state = torch.load(filepath)
        state_dict_loaded = state["network"]
        self.load_state_dict(state_dict=state_dict_loaded)  # BUG
        return state


class TaskSampler:
    def __init__(self, current_iter):
        self.generator = torch.Generator().manual_seed(100 + current_iter)
        self.prototypes = torch.randn(5, 28, generator=torch.Generator().manual_seed(7))

    def sample(self):
        y = torch.randint(0, 5, (25,), generator=self.generator)
        return self.prototypes[y] + 0.8 * torch.randn(25, 28, generator=self.generator), y


class ExperimentBuilder:
    def __init__(self, args, model, saved_models_filepath):
        self.args, self.model, self.saved_models_filepath = args, model, saved_models_filepath
        self.state = {"best_val_acc": 0.0, "best_val_iter": 0, "current_iter": 0}
        self.start_epoch = 0
        if self.args.continue_from_epoch == "latest":
            checkpoint = os.path.join(self.saved_models_filepath, "train_model_latest")
            if os.path.exists(checkpoint):
                self.state = self.model.load_model(model_save_dir=self.saved_models_filepath,
                                                   model_name="train_model", model_idx="latest")
                self.start_epoch = int(self.state["current_iter"] / self.args.total_iter_per_epoch)
        self.data = TaskSampler(current_iter=self.state["current_iter"])
        self.epoch = int(self.state["current_iter"] / self.args.total_iter_per_epoch)

    def save_models(self, model, epoch, state):
        model.save_model(model_save_dir=os.path.join(self.saved_models_filepath, f"train_model_{int(epoch)}"),
                         state=state)
        model.save_model(model_save_dir=os.path.join(self.saved_models_filepath, "train_model_latest"), state=state)

    def run_experiment(self, epochs_this_run):
        stop_at = min(self.args.total_epochs, self.epoch + epochs_this_run) * self.args.total_iter_per_epoch
        while self.state["current_iter"] < stop_at:
            train_sample = self.data.sample()
            losses, _ = self.model.run_train_iter(
                data_batch=train_sample, epoch=self.state["current_iter"] / self.args.total_iter_per_epoch)
            self.state["current_iter"] += 1
            if self.state["current_iter"] % self.args.total_iter_per_epoch == 0:
                self.epoch += 1
                self.save_models(model=self.model, epoch=self.epoch, state=self.state)
                print("epoch", self.epoch, "loss", round(losses["loss"].item(), 4), "lr", losses["learning_rate"])


def main(saved_models_filepath, epochs_this_run):
    model = MAMLFewShotClassifier(Args())
    builder = ExperimentBuilder(Args(), model, saved_models_filepath)
    print("starting at iteration", builder.state["current_iter"])
    builder.run_experiment(epochs_this_run)


if len(sys.argv) > 1 and sys.argv[1] == "first-job":  # total_epochs_before_pause: the earlier job ran 3 epochs
    main(sys.argv[2], epochs_this_run=3)
    sys.exit(0)
saved = tempfile.mkdtemp()
subprocess.run([sys.executable, __file__, "first-job", saved], check=True,
               env={k: v for k, v in os.environ.items() if not k.startswith("TORCHDOCTOR")})
main(saved, epochs_this_run=3)
