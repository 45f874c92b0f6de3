# Source: synthetic: state 1 of run15miss
# Original: none (our own script; a text classifier with a frozen embedding and an auxiliary head left unused)
# Bug: the loop never clears the gradients; the optimizer's first and last parameters get none, the others sum up.
import torch
from torch import nn

torch.manual_seed(0)


class TextNet(nn.Module):
    def __init__(self, vocab=50):
        super().__init__()
        self.embed = nn.Embedding(vocab, 16)
        self.body = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
        self.aux_head = nn.Linear(32, 2)

    def forward(self, x):
        return self.body(self.embed(x).mean(1))


def fit(model, loader, optimizer, epochs=2):
    for epoch in range(epochs):
        for tokens, label in loader:
            loss = nn.functional.cross_entropy(model(tokens), label)
            loss.backward()  # BUG
            optimizer.step()
        print("epoch", epoch, loss.item())


model = TextNet()
model.embed.weight.requires_grad_(False)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
data = torch.utils.data.TensorDataset(torch.randint(0, 50, (320, 6)), torch.randint(0, 4, (320,)))
fit(model, torch.utils.data.DataLoader(data, batch_size=8, shuffle=True), optimizer)
