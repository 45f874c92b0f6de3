# Source: https://github.com/KevinMusgrave/pytorch-metric-learning/pull/660
# Original: KevinMusgrave/pytorch-metric-learning src/pytorch_metric_learning/losses/pnp_loss.py (PNPLoss)
# Bug: the per-anchor loss divides by N_pos, the anchor's number of positives; an anchor whose label
# occurs once in the batch has N_pos = 0, so its term is 0/0 = nan and the batch mean is nan.
import torch
import torch.nn.functional as F


class PNPLoss(torch.nn.Module):
    def __init__(self, b=2, alpha=1, anneal=0.01):
        super().__init__()
        self.b, self.alpha, self.anneal = b, alpha, anneal

    def forward(self, embeddings, labels):
        embeddings = F.normalize(embeddings, dim=1)
        n = embeddings.size(0)
        I_pos = (labels[:, None] == labels[None, :]).float().fill_diagonal_(0)
        I_neg = (labels[:, None] != labels[None, :]).float()
        N_pos = torch.sum(I_pos, dim=-1)
        sim_all = embeddings @ embeddings.t()
        sim_diff = sim_all.unsqueeze(1) - sim_all.unsqueeze(2)  # [anchor, j, k]: s_ak - s_aj
        sim_sg = torch.sigmoid(sim_diff / self.anneal) * I_neg.unsqueeze(1)
        sim_all_rk = torch.sum(sim_sg, dim=-1)  # how many negatives outrank each positive
        sim_all_rk = torch.log(1 + self.b * sim_all_rk) / self.b
        loss = torch.sum(sim_all_rk * I_pos, dim=-1) / N_pos.reshape(-1)  # BUG
        return torch.sum(loss) / n


torch.manual_seed(0)
num_classes, per_class = 10, 3
prototypes = torch.randn(num_classes, 20)
model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 16))
criterion = PNPLoss()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(1)
for step in range(60):
    # A sampler of 3 images per class, topped up with a few random ones: those may be singletons.
    labels = torch.cat([torch.arange(num_classes).repeat_interleave(per_class)[:24],
                        torch.randint(0, num_classes, (4,), generator=g)])
    x = prototypes[labels] + 0.3 * torch.randn(labels.numel(), 20, generator=g)
    loss = criterion(model(x), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step % 10 == 0:
        print(f"step {step} loss {loss.item():.4f}")
