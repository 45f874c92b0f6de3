# Source: https://github.com/snakers4/silero-vad/pull/699
# Original: snakers4/silero-vad tuning/utils.py (train)
# Bug: the fine-tuning helper's batch loop calls loss.backward() and optimizer.step() but never
# optimizer.zero_grad(), so each step applies the sum of every earlier batch's gradient.
import torch

torch.manual_seed(0)


class TinyVAD(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = torch.nn.Sequential(torch.nn.Conv1d(1, 16, 9, stride=4), torch.nn.ReLU(), torch.nn.Conv1d(16, 16, 5, stride=2), torch.nn.ReLU())
        self.rnn = torch.nn.LSTM(16, 32, batch_first=True)
        self.dec = torch.nn.Linear(32, 1)

    def forward(self, wav):
        h, _ = self.rnn(self.enc(wav.unsqueeze(1)).transpose(1, 2))
        return torch.sigmoid(self.dec(h)).squeeze(-1)


def train(config, loader, model, criterion, optimizer):
    model.train()
    total = 0.0
    for i, (wav, targets) in enumerate(loader):
        probs = model(wav)
        targets = targets[:, : probs.size(1)]
        loss = (criterion(probs, targets) * config["weights"]).mean()
        loss.backward()  # BUG
        optimizer.step()
        total += loss.item()
    return total / len(loader)


loader = [(torch.randn(4, 400), (torch.rand(4, 100) > 0.5).float()) for _ in range(10)]
model = TinyVAD()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
criterion = torch.nn.BCELoss(reduction="none")
for epoch in range(3):
    print("epoch", epoch, "loss", round(train({"weights": 1.0}, loader, model, criterion, optimizer), 4))
