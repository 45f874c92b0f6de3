# Source: https://github.com/Quantinuum/lambeq/pull/251
# Original: Quantinuum/lambeq lambeq/training/trainer.py (Trainer._step_and_eval, fit, _summarize_metric) and
# lambeq/training/pytorch_trainer.py (PytorchTrainer.training_step), read at 362b28d
# Bug: training_step returns the model's prediction with its autograd graph; _step_and_eval hands it to each
# evaluation function and keeps the results in running lists until the end of the epoch. A metric computed with
# torch ops (here a BCE) keeps every step's graph alive: memory grows with every batch of the epoch.
import torch
import torch.nn.functional as F

torch.manual_seed(0)


class Dataset:
    def __init__(self, x, y, batch_size):
        self.x, self.y, self.batch_size = x, y, batch_size
        self.batches_per_epoch = len(x) // batch_size

    def __iter__(self):
        order = torch.randperm(len(self.x))
        for i in range(self.batches_per_epoch):
            idx = order[i * self.batch_size:(i + 1) * self.batch_size]
            yield self.x[idx], self.y[idx]


class Trainer:
    def __init__(self, model, loss_function, optimizer, epochs, evaluate_functions=None, evaluate_on_train=True):
        self.model, self.loss_function, self.optimizer = model, loss_function, optimizer
        self.epochs, self.evaluate_functions, self.evaluate_on_train = epochs, evaluate_functions, evaluate_on_train
        self.train_costs, self.train_eval_results = [], {name: [] for name in evaluate_functions}
        self._train_eval_running = {name: [] for name in evaluate_functions}

    def training_step(self, batch):
        x, y = batch
        y_hat = self.model(x)
        loss = self.loss_function(y_hat, y)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return y_hat, loss.item()

    def _step_and_eval(self, batch, step_func, losses, eval_results, evaluate=True):
        y_hat, loss = step_func(batch)
        losses.append((len(batch[0]), loss))
        if self.evaluate_functions is not None and evaluate:
            for metr, func in self.evaluate_functions.items():
                res = func(y_hat, batch[1])
                eval_results[metr].append((len(batch[0]), res))  # BUG
        return loss

    @staticmethod
    def _get_weighted_mean(values):
        return sum(n * float(v) for n, v in values) / sum(n for n, _ in values)

    def fit(self, train_dataset):
        for epoch in range(1, self.epochs + 1):
            train_losses = []
            for batch in train_dataset:
                self._step_and_eval(batch, self.training_step, train_losses, self._train_eval_running,
                                    self.evaluate_on_train)
            self.train_costs.append(self._get_weighted_mean(train_losses))
            for name in self._train_eval_running:
                self.train_eval_results[name].append(self._get_weighted_mean(self._train_eval_running[name]))
                self._train_eval_running[name] = []
            print("epoch", epoch, "loss", round(self.train_costs[-1], 4),
                  {k: round(v[-1], 4) for k, v in self.train_eval_results.items()})


model = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.Tanh(), torch.nn.Linear(128, 1), torch.nn.Sigmoid(),
                            torch.nn.Flatten(0))
x = torch.randn(3200, 32)
y = (x[:, :4].sum(1) > 0).float()
trainer = Trainer(model, F.binary_cross_entropy, torch.optim.AdamW(model.parameters(), lr=1e-3), epochs=2,
                  evaluate_functions={"bce": lambda y_hat, y: F.binary_cross_entropy(y_hat, y),
                                      "acc": lambda y_hat, y: float(((y_hat > 0.5) == y).float().mean())})
trainer.fit(Dataset(x, y, batch_size=16))
