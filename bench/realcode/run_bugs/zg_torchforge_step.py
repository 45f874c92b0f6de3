# Source: https://github.com/meta-pytorch/torchforge/pull/71
# Original: meta-pytorch/torchforge apps/sft/main.py (ForgeSFTRecipe.train_step / forward_backward)
# Bug: the recipe's train_step runs forward_backward, the optimizer step and the LR scheduler step but never
# zeroes the gradients, so every step applies the running sum of all earlier gradients.
import torch
import torch.nn.functional as F

torch.manual_seed(0)


class SFTRecipe:
    def __init__(self, model, lr, total_steps):
        self.model = model
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
        self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: 1 - s / total_steps)
        self.step = 0

    def forward_backward(self, inputs, labels):
        logits = self.model(inputs)
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1), ignore_index=-100)
        loss.backward()  # BUG
        return loss

    def train_step(self, batch):
        inputs, labels = batch[:, :-1], batch[:, 1:]
        loss = self.forward_backward(inputs, labels)
        self.optimizer.step()
        self.lr_scheduler.step()
        self.step += 1
        return loss.item()


vocab = 96
model = torch.nn.Sequential(torch.nn.Embedding(vocab, 48), torch.nn.Linear(48, 96), torch.nn.SiLU(), torch.nn.Linear(96, vocab))
recipe = SFTRecipe(model, lr=3e-4, total_steps=120)
for i in range(120):
    loss = recipe.train_step(torch.randint(0, vocab, (8, 17)))
    if i % 30 == 0:
        print("step", i, "loss", round(loss, 4))
