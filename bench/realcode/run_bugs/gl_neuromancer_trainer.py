# Source: https://github.com/pnnl/neuromancer/pull/292
# Original: pnnl/neuromancer src/neuromancer/trainer.py (Trainer.train: the batch loop and the epoch mean)
# Bug: the trainer keeps each batch's loss tensor, graph and all, in `losses` to average it at the end of the
# epoch; every batch's autograd graph stays alive until then ("hundreds of MB or a few GB of autograd graph per
# long training run", the PR measured; fixed by detaching the metrics before they are stored).
import torch

torch.manual_seed(0)


class Problem(torch.nn.Module):
    """A dict-in, dict-out model that also computes its own loss, as neuromancer's Problem does."""

    def __init__(self):
        super().__init__()
        self.policy = torch.nn.Sequential(torch.nn.Linear(6, 48), torch.nn.Tanh(), torch.nn.Linear(48, 48),
                                          torch.nn.Tanh(), torch.nn.Linear(48, 2))

    def forward(self, batch):
        u = self.policy(batch["x"])
        x_next = batch["x"][:, :2] + 0.1 * u
        loss = ((x_next - batch["ref"]) ** 2).mean() + 0.01 * (u ** 2).mean()
        return {"u": u, "train_loss": loss, "dev_loss": loss}


class Trainer:
    def __init__(self, problem, train_data, optimizer, epochs=3, train_metric="train_loss", clip=100.0):
        self.model, self.train_data, self.optimizer = problem, train_data, optimizer
        self.epochs, self.train_metric, self.clip = epochs, train_metric, clip

    def train(self):
        for i in range(self.epochs):
            self.model.train()
            losses = []
            for t_batch in self.train_data:
                t_batch["epoch"] = i
                output = self.model(t_batch)
                self.optimizer.zero_grad()
                output[self.train_metric].backward()
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
                self.optimizer.step()
                losses.append(output[self.train_metric])  # BUG
            output[f"mean_{self.train_metric}"] = torch.mean(torch.stack(losses))
            print(f"epoch: {i}  {self.train_metric}: {output[f'mean_{self.train_metric}'].item():.5f}")


g = torch.Generator().manual_seed(1)
train_data = [{"x": torch.randn(16, 6, generator=g), "ref": torch.randn(16, 2, generator=g) * 0.1} for _ in range(40)]
problem = Problem()
Trainer(problem, train_data, torch.optim.AdamW(problem.parameters(), lr=1e-3)).train()
