# Source: https://github.com/pliang279/MultiBench/issues/26
# Original: pliang279/MultiBench training_structures/Supervised_Learning.py (train: the per-epoch validation block)
# Bug: the validation block calls model.eval() and then, a few lines later, model.train() before its forwards,
# so every validation loss (and the best-model choice made from it) is computed with dropout active.
import torch
import torch.nn.functional as F

torch.manual_seed(0)


class LateFusion(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.audio = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Dropout(0.3))
        self.video = torch.nn.Sequential(torch.nn.Linear(35, 32), torch.nn.ReLU(), torch.nn.Dropout(0.3))
        self.head = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(32, 2))

    def forward(self, audio, video):
        return self.head(torch.cat([self.audio(audio), self.video(video)], dim=1))


def make_batches(n):
    return [(torch.randn(16, 20), torch.randn(16, 35), torch.randint(0, 2, (16,))) for _ in range(n)]


def train(model, train_batches, valid_batches, epochs, lr=1e-3):
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    best = float("inf")
    for epoch in range(epochs):
        model.train()
        total = 0.0
        for audio, video, label in train_batches:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(audio, video), label)
            loss.backward()
            optimizer.step()
            total += loss.item()
        model.eval()
        with torch.no_grad():
            model.train()  # BUG
            val_loss = 0.0
            for audio, video, label in valid_batches:
                val_loss += F.cross_entropy(model(audio, video), label).item()
        val_loss /= len(valid_batches)
        if val_loss < best:
            best = val_loss
        print(f"epoch {epoch} train {total / len(train_batches):.4f} valid {val_loss:.4f}")
    return best


print("best", round(train(LateFusion(), make_batches(20), make_batches(5), epochs=6), 4))
