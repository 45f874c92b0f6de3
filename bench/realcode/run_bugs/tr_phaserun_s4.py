# Synthetic: state 4 of run14 (written for torchdoctor's dev set, no public source of its own)
# Bug: one `run_epoch(loader, train)` serves both phases; the validation call switches the model to eval mode and
# nothing switches it back, so from the second epoch on dropout and batch norm train in eval mode. model.train()
# belongs after the validation call (or at the top of the training phase).
import torch
import torch.nn as nn

torch.manual_seed(0)


class Engine:
    def __init__(self, model, optimizer):
        self.model = model
        self.optimizer = optimizer
        self.loss_fn = nn.BCEWithLogitsLoss()

    def run_epoch(self, loader, train):
        if not train:
            self.model.eval()
        losses = []
        for x, y in loader:
            with torch.set_grad_enabled(train):
                logits = self.model(x)
                loss = self.loss_fn(logits, y)
            if train:
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()
            losses.append(loss.detach())
        return torch.stack(losses).mean().item()


model = nn.Sequential(nn.Linear(12, 40), nn.BatchNorm1d(40), nn.ReLU(), nn.Dropout(0.25), nn.Linear(40, 1))
engine = Engine(model, torch.optim.Adam(model.parameters(), lr=1e-3))
train_loader = [(torch.randn(32, 12), torch.randint(0, 2, (32, 1)).float()) for _ in range(10)]
val_loader = [(torch.randn(32, 12), torch.randint(0, 2, (32, 1)).float()) for _ in range(3)]
model.train()
for epoch in range(4):
    train_loss = engine.run_epoch(train_loader, train=True)
    val_loss = engine.run_epoch(val_loader, train=False)  # BUG
    print(f"epoch {epoch}: train {train_loss:.4f} val {val_loss:.4f}")
