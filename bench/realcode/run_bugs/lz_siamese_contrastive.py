# Source: https://github.com/adambielski/siamese-triplet/issues/18
# Original: adambielski/siamese-triplet losses.py (ContrastiveLoss), datasets.py (SiameseMNIST), trainer.py (fit)
# Bug: the margin term square-roots the squared distance with no epsilon; a positive pair drawn as the same sample
# twice has distance exactly 0, sqrt's gradient there is infinite, and 0 * inf in the backward gives NaN gradients
# on every weight of the embedding net (the loss itself is finite at that step).
import torch
import torch.nn.functional as F

torch.manual_seed(0)


class ContrastiveLoss(torch.nn.Module):
    def __init__(self, margin):
        super().__init__()
        self.margin = margin

    def forward(self, output1, output2, target):
        distances = (output2 - output1).pow(2).sum(1)
        hinge = F.relu(self.margin - distances.sqrt()).pow(2)  # BUG
        losses = 0.5 * (target.float() * distances + (1 - target).float() * hinge)
        return losses.mean()


class SiamesePairs(torch.utils.data.Dataset):
    """Each item pairs a sample with a random one of the same class (target 1) or of another class (target 0)."""

    def __init__(self, data, labels):
        self.data, self.labels = data, labels
        self.by_label = {int(c): torch.nonzero(labels == c).flatten().tolist() for c in labels.unique()}

    def __len__(self):
        return len(self.data)

    def __getitem__(self, index):
        label = int(self.labels[index])
        target = int(torch.randint(0, 2, ()))
        if target == 1:
            pool = self.by_label[label]  # may return index itself: the same sample twice
        else:
            other = [c for c in self.by_label if c != label][int(torch.randint(0, len(self.by_label) - 1, ()))]
            pool = self.by_label[other]
        partner = pool[int(torch.randint(0, len(pool), ()))]
        return self.data[index], self.data[partner], target


class EmbeddingNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.PReLU(), torch.nn.Linear(64, 2))

    def forward(self, x):
        return self.fc(x)


class SiameseNet(torch.nn.Module):
    def __init__(self, embedding_net):
        super().__init__()
        self.embedding_net = embedding_net

    def forward(self, x1, x2):
        return self.embedding_net(x1), self.embedding_net(x2)


def train_epoch(loader, model, loss_fn, optimizer):
    model.train()
    total = 0.0
    for x1, x2, target in loader:
        optimizer.zero_grad()
        out1, out2 = model(x1, x2)
        loss = loss_fn(out1, out2, target)
        loss.backward()
        optimizer.step()
        total += loss.item()
    return total / len(loader)


centers = torch.randn(5, 20) * 3
labels = torch.arange(5).repeat_interleave(20)
data = centers[labels] + torch.randn(100, 20)
loader = torch.utils.data.DataLoader(SiamesePairs(data, labels), batch_size=10, shuffle=True)
model = SiameseNet(EmbeddingNet())
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
for epoch in range(4):
    print("epoch", epoch, "loss", train_epoch(loader, model, ContrastiveLoss(margin=1.0), optimizer))
