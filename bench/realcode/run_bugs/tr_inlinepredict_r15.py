# Source: synthetic: run15 line shape (inline evaluation in the epoch loop through a prediction helper)
# Bug: the epoch loop switches the model to eval mode inline and scores the validation set through a predict()
# helper; training runs in train_epoch(), which never calls model.train(), and model.train() is called only once
# before the loop: from the second epoch on the dropout is off during training. The line where the model leaves
# train mode is the inline model.eval(); model.train() belongs after the validation block.
# `healthy` calls model.train() after the validation block.
import sys

import torch
import torch.nn as nn

torch.manual_seed(0)
HEALTHY = "healthy" in sys.argv[1:]


def train_epoch(model, opt, batches):
    for x, y in batches:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    return loss.item()


def predict(model, x):
    return model(x).argmax(dim=1)


model = nn.Sequential(nn.Linear(16, 48), nn.ReLU(), nn.Dropout(0.4), nn.Linear(48, 4))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
train = [(torch.randn(16, 16), torch.randint(0, 4, (16,))) for _ in range(12)]
val = [(torch.randn(16, 16), torch.randint(0, 4, (16,))) for _ in range(3)]
model.train()
for epoch in range(3):
    last = train_epoch(model, opt, train)
    model.eval()  # BUG
    correct = 0
    with torch.no_grad():
        for x, y in val:
            pred = predict(model, x)
            correct += int((pred == y).sum())
    print(f"epoch {epoch} loss {last:.4f} val acc {correct / 48:.3f}")
    if HEALTHY:
        model.train()
print("done")
