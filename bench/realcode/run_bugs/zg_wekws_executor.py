# Source: https://github.com/wenet-e2e/wekws/commit/141d40704f33bd87805b3010548390592aab58c2
# Original: wenet-e2e/wekws kws/utils/executor.py (Executor.train)
# Bug: every batch calls loss.backward() and optimizer.step() but gradients are never zeroed.
import torch
import torch.nn.functional as F

torch.manual_seed(0)


class Executor:
    def __init__(self):
        self.step = 0

    def train(self, model, optimizer, batches):
        model.train()
        for feats, target in batches:
            logits = model(feats)
            loss = F.binary_cross_entropy_with_logits(logits.squeeze(-1), target)
            loss.backward()  # BUG
            torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            optimizer.step()
            self.step += 1


model = torch.nn.Sequential(torch.nn.Linear(40, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
batches = [(torch.randn(16, 40), torch.randint(0, 2, (16,)).float()) for _ in range(20)]
executor = Executor()
for epoch in range(3):
    executor.train(model, optimizer, batches)
print("steps", executor.step)
