# Synthetic: state 1 of run14 (written for torchdoctor's dev set, no public source of its own)
# Bug: the trainer's validate() was copied from its train step and dropped the backward but kept the optimizer
# step: every validation batch re-applies the last training batch's gradients (Adam's state moves the weights).
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)


class Trainer:
    def __init__(self):
        self.backbone = nn.Sequential(nn.Linear(10, 48), nn.GELU(), nn.Dropout(0.1))
        self.classifier = nn.Linear(48, 4)
        params = [*self.backbone.parameters(), *self.classifier.parameters()]
        self.optimizer = torch.optim.Adam(params, lr=2e-3)

    def set_mode(self, training):
        self.backbone.train(training)
        self.classifier.train(training)

    def train_step(self, x, y):
        logits = self.classifier(self.backbone(x))
        loss = F.cross_entropy(logits, y)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return loss.item()

    def validate(self, batches):
        self.set_mode(False)
        total = 0.0
        for x, y in batches:
            logits = self.classifier(self.backbone(x))
            loss = F.cross_entropy(logits, y)
            self.optimizer.step()  # BUG
            total += loss.item()
        self.set_mode(True)
        return total / len(batches)


trainer = Trainer()
train = [(torch.randn(32, 10), torch.randint(0, 4, (32,))) for _ in range(12)]
val = [(torch.randn(32, 10), torch.randint(0, 4, (32,))) for _ in range(3)]
for epoch in range(5):
    tl = sum(trainer.train_step(x, y) for x, y in train) / len(train)
    print(f"epoch {epoch} train {tl:.4f} val {trainer.validate(val):.4f}")
