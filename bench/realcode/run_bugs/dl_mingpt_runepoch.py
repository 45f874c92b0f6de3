# Source: https://github.com/karpathy/minGPT/pull/53
# Original: karpathy/minGPT mingpt/trainer.py (Trainer.train / run_epoch)
# Bug: run_epoch(split) constructs a new DataLoader for train and test on every epoch; the fix builds both
# loaders once before the epoch loop.
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

torch.manual_seed(0)
vocab, block = 32, 16
train_dataset = torch.utils.data.TensorDataset(torch.randint(0, vocab, (256, block + 1)))
test_dataset = torch.utils.data.TensorDataset(torch.randint(0, vocab, (64, block + 1)))
model = torch.nn.Sequential(torch.nn.Embedding(vocab, 32), torch.nn.Linear(32, vocab))
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)


def run_epoch(split):
    is_train = split == "train"
    model.train(is_train)
    data = train_dataset if is_train else test_dataset
    loader = DataLoader(data, shuffle=True, pin_memory=True, batch_size=32, num_workers=1)  # BUG
    losses = []
    for (xy,) in loader:
        x, y = xy[:, :-1], xy[:, 1:]
        with torch.set_grad_enabled(is_train):
            logits = model(x)
            loss = F.cross_entropy(logits.reshape(-1, vocab), y.reshape(-1))
            losses.append(loss.item())
        if is_train:
            model.zero_grad()
            loss.backward()
            optimizer.step()
    return sum(losses) / len(losses)


for epoch in range(4):
    run_epoch("train")
    print("test loss", run_epoch("test"))
