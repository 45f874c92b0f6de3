# Source: https://github.com/dice-group/dice-embeddings/issues/432
# Original: dice-group/dice-embeddings dicee/trainer/torch_trainer.py (TorchTrainer._run_batch,
#   forward_backward_update, _run_epoch, fit)
# Bug: with gradient_accumulation_steps = 4, _run_batch clears the gradients only on every 4th batch, but
# forward_backward_update calls optimizer.step() after every backward: the optimizer steps on every micro-batch
# and re-applies the gradients summed since the last zero_grad (the issue: weights 0.2 then 0.56 where 0 then
# 0.2 were expected).
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class AbstractTrainer:
    def __init__(self, args, callbacks):
        self.attributes = args
        self.callbacks = callbacks


class TorchTrainer(AbstractTrainer):
    def __init__(self, args, callbacks):
        super().__init__(args, callbacks)
        self.optimizer = None
        self.model = None
        self.train_dataloaders = None
        self.training_step = None
        torch.manual_seed(self.attributes.random_seed)

    def _run_batch(self, i: int, x_batch, y_batch) -> float:
        if self.attributes.gradient_accumulation_steps > 1:
            # (1) Update parameters every gradient_accumulation_steps mini-batch.
            if i % self.attributes.gradient_accumulation_steps == 0:
                self.optimizer.zero_grad(set_to_none=True)
        else:
            self.optimizer.zero_grad(set_to_none=True)
        return self.forward_backward_update(x_batch, y_batch)

    def _run_epoch(self, epoch: int) -> float:
        epoch_loss = 0
        i = 0
        for i, (x_batch, y_batch) in enumerate(self.train_dataloaders):
            epoch_loss += self._run_batch(i, x_batch, y_batch)
        return epoch_loss / (i + 1)

    def fit(self, model, train_dataloaders) -> None:
        self.model = model
        self.train_dataloaders = train_dataloaders
        self.optimizer = self.model.configure_optimizers()
        self.training_step = self.model.training_step
        for epoch in range(self.attributes.max_epochs):
            avg_epoch_loss = self._run_epoch(epoch)
            print(f"Epoch:{epoch + 1} | Loss:{avg_epoch_loss:.8f}")

    def forward_backward_update(self, x_batch, y_batch) -> float:
        batch_loss = self.training_step(batch=(x_batch, y_batch))
        batch_loss.backward()
        self.optimizer.step()  # BUG
        return batch_loss.item()


class DistMult(torch.nn.Module):
    def __init__(self, num_entities=200, num_relations=12, dim=32, learning_rate=0.02):
        super().__init__()
        self.entity_embeddings = torch.nn.Embedding(num_entities, dim)
        self.relation_embeddings = torch.nn.Embedding(num_relations, dim)
        self.learning_rate = learning_rate

    def forward(self, x):
        h, r = self.entity_embeddings(x[:, 0]), self.relation_embeddings(x[:, 1])
        return (h * r) @ self.entity_embeddings.weight.t()

    def training_step(self, batch):
        x, y = batch
        return F.binary_cross_entropy_with_logits(self(x), y)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.learning_rate)


def main():
    args = SimpleNamespace(random_seed=1, gradient_accumulation_steps=4, max_epochs=3)
    g = torch.Generator().manual_seed(0)
    x = torch.stack([torch.randint(0, 200, (1024,), generator=g), torch.randint(0, 12, (1024,), generator=g)], 1)
    y = torch.zeros(1024, 200)
    y[torch.arange(1024), torch.randint(0, 200, (1024,), generator=g)] = 1.0
    loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)
    trainer = TorchTrainer(args, callbacks=[])
    trainer.fit(DistMult(), loader)


if __name__ == "__main__":
    main()
