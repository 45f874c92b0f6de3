# Source: https://github.com/AntreasAntoniou/HowToTrainYourMAMLPytorch/issues/31
# Original: AntreasAntoniou/HowToTrainYourMAMLPytorch few_shot_learning_system.py (MAMLFewShotClassifier.save_model,
# load_model, meta_update, run_train_iter) and experiment_builder.py (save_models, continue_from_epoch='latest'),
# read at 96c2b0f
# Bug: save_model stores the experiment state plus state['network'] = self.state_dict() and nothing else; the outer
# Adam (and its CosineAnnealingLR) is never saved, so a run continued from 'latest' restarts the meta-optimizer from
# zero moments (the maintainer: "Makes perfect sense and yes you are right. I noticed it some time ago and forgot to
# update the code"). Ours: a small MLP meta-learner with a first-order inner loop (torch.func.functional_call) instead
# of the VGG with per-step BN and learned inner learning rates, random 5-way 1-shot tasks, 2 epochs of 4 iterations,
# then a continued builder; the save/load and experiment-state logic is theirs.
import os
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.func import functional_call

torch.manual_seed(0)


class Args:
    meta_learning_rate = 1e-3
    min_learning_rate = 1e-5
    total_epochs = 4
    total_iter_per_epoch = 4
    number_of_training_steps_per_iter = 2
    task_learning_rate = 0.1
    num_classes_per_set = 5


class MAMLFewShotClassifier(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.args = args
        self.current_epoch = 0
        self.classifier = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, args.num_classes_per_set))
        self.optimizer = optim.Adam(self.trainable_parameters(), lr=args.meta_learning_rate, amsgrad=False)
        self.scheduler = optim.lr_scheduler.CosineAnnealingLR(optimizer=self.optimizer, T_max=self.args.total_epochs,
                                                              eta_min=self.args.min_learning_rate)

    def trainable_parameters(self):
        for param in self.parameters():
            if param.requires_grad:
                yield param

    def train_forward_prop(self, data_batch, epoch):
        x_support_set, x_target_set, y_support_set, y_target_set = data_batch
        total_losses = []
        for x_s, x_t, y_s, y_t in zip(x_support_set, x_target_set, y_support_set, y_target_set):
            names_weights_copy = dict(self.classifier.named_parameters())
            for _ in range(self.args.number_of_training_steps_per_iter):
                support_loss = F.cross_entropy(functional_call(self.classifier, names_weights_copy, (x_s,)), y_s)
                grads = torch.autograd.grad(support_loss, list(names_weights_copy.values()))
                names_weights_copy = {k: w - self.args.task_learning_rate * g
                                      for (k, w), g in zip(names_weights_copy.items(), grads)}
            total_losses.append(F.cross_entropy(functional_call(self.classifier, names_weights_copy, (x_t,)), y_t))
        return {'loss': torch.mean(torch.stack(total_losses))}

    def meta_update(self, loss):
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()

    def run_train_iter(self, data_batch, epoch):
        epoch = int(epoch)
        if not self.training:
            self.train()
        losses = self.train_forward_prop(data_batch=data_batch, epoch=epoch)
        self.meta_update(loss=losses['loss'])
        # ours: the epoch-indexed scheduler.step(epoch=epoch) is deprecated; step once per new epoch, after the update
        if self.current_epoch != epoch:
            self.current_epoch = epoch
            self.scheduler.step()
        losses['learning_rate'] = self.scheduler.get_last_lr()[0]
        self.optimizer.zero_grad()
        self.zero_grad()
        return losses

    def save_model(self, model_save_dir, state):
        """
        Save the network parameter state and experiment state dictionary.
        """
        state['network'] = self.state_dict()
        torch.save(state, f=model_save_dir)  # BUG

    def load_model(self, model_save_dir, model_name, model_idx):
        filepath = os.path.join(model_save_dir, f"{model_name}_{model_idx}")
        state = torch.load(filepath)
        state_dict_loaded = state['network']
        self.load_state_dict(state_dict=state_dict_loaded)
        return state


def sample_tasks(n_tasks=4, n_way=5):
    x_s = torch.randn(n_tasks, n_way, 32)
    x_t = x_s.repeat(1, 3, 1) + 0.1 * torch.randn(n_tasks, 3 * n_way, 32)
    y_s = torch.arange(n_way).repeat(n_tasks, 1)
    y_t = torch.arange(n_way).repeat(n_tasks, 3)
    return x_s, x_t, y_s, y_t


class ExperimentBuilder:
    def __init__(self, args, model, saved_models_filepath, continue_from_epoch='from_scratch'):
        self.args, self.model = args, model
        self.saved_models_filepath = saved_models_filepath
        self.state = {'current_iter': 0}
        self.start_epoch = 0
        if continue_from_epoch == 'latest':
            checkpoint = os.path.join(self.saved_models_filepath, "train_model_latest")
            if os.path.exists(checkpoint):
                self.state = self.model.load_model(model_save_dir=self.saved_models_filepath, model_name="train_model",
                                                   model_idx='latest')
                self.start_epoch = int(self.state['current_iter'] / self.args.total_iter_per_epoch)

    def save_models(self, model, epoch, state):
        model.save_model(model_save_dir=os.path.join(self.saved_models_filepath, f"train_model_{int(epoch)}"),
                         state=state)
        model.save_model(model_save_dir=os.path.join(self.saved_models_filepath, "train_model_latest"),
                         state=state)

    def run_experiment(self, until_epoch):
        for epoch in range(self.start_epoch, until_epoch):
            for _ in range(self.args.total_iter_per_epoch):
                losses = self.model.run_train_iter(data_batch=sample_tasks(), epoch=epoch)
                self.state['current_iter'] += 1
            print(f"epoch {epoch} loss {losses['loss'].item():.4f} lr {losses['learning_rate']:.6f}")
            self.save_models(model=self.model, epoch=epoch, state=self.state)


if __name__ == '__main__':
    args = Args()
    save_dir = tempfile.mkdtemp()
    ExperimentBuilder(args, MAMLFewShotClassifier(args), save_dir).run_experiment(until_epoch=2)
    ExperimentBuilder(args, MAMLFewShotClassifier(args), save_dir, continue_from_epoch='latest').run_experiment(
        until_epoch=4)
