# Source: https://github.com/tenstorrent/tt-blacksmith/pull/711
# Original: tenstorrent/tt-blacksmith trainer (LoRA LLM training step)
# Bug: the trainer's step applies the optimizer after each backward but never zeroes the gradients, so every
# update carries the sum of all earlier batches' gradients; the fix turns zero_grad on after each step.
import torch
import torch.nn.functional as F

torch.manual_seed(0)


class LoRALinear(torch.nn.Module):
    def __init__(self, base, rank=4):
        super().__init__()
        self.base = base
        self.base.weight.requires_grad_(False)
        self.a = torch.nn.Parameter(torch.randn(rank, base.in_features) * 0.01)
        self.b = torch.nn.Parameter(torch.zeros(base.out_features, rank))

    def forward(self, x):
        return self.base(x) + x @ self.a.t() @ self.b.t()


class Trainer:
    def __init__(self, model, lr=1e-3, zero_grad=False):
        self.model = model
        self.optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
        self.zero_grad = zero_grad

    def train_step(self, inputs, labels):
        logits = self.model(inputs)
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.reshape(-1))
        loss.backward()  # BUG
        self.optimizer.step()
        if self.zero_grad:
            self.optimizer.zero_grad()
        return loss.item()


vocab = 32
model = torch.nn.Sequential(torch.nn.Embedding(vocab, 16), LoRALinear(torch.nn.Linear(16, vocab)))
trainer = Trainer(model)
for step in range(40):
    tokens = torch.randint(0, vocab, (4, 9))
    trainer.train_step(tokens[:, :-1], tokens[:, 1:])
print("done")
