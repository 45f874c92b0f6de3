# Source: https://github.com/mlelarge/graph_neural_net/pull/37
# Original: mlelarge/graph_neural_net toolbox/losses.py (triplet_loss.forward)
# Bug: torch.softmax is applied to the raw node-similarity scores before the default
# nn.CrossEntropyLoss(reduction='sum'), a second softmax; the fix feeds the raw scores.
import torch

torch.manual_seed(0)
n_vertices = 12


class triplet_loss(torch.nn.Module):
    def __init__(self, loss_reduction="mean"):
        super().__init__()
        self.loss = torch.nn.CrossEntropyLoss(reduction="sum")
        self.loss_reduction = loss_reduction

    def forward(self, outputs):
        # outputs: batch x n x n similarity scores; the target is the identity matching
        target = torch.arange(outputs.shape[1]).repeat(outputs.shape[0])
        proba = torch.softmax(outputs, dim=-1)  # BUG
        loss = self.loss(proba.view(-1, outputs.shape[-1]), target)
        return loss / outputs.shape[0] / outputs.shape[1]


class Siamese(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gnn = torch.nn.Sequential(torch.nn.Linear(n_vertices, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))

    def forward(self, g1, g2):
        return self.gnn(g1) @ self.gnn(g2).transpose(1, 2)


model = Siamese()
criterion = triplet_loss()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
for step in range(40):
    g1 = (torch.rand(4, n_vertices, n_vertices) > 0.7).float()
    perm_noise = (torch.rand(4, n_vertices, n_vertices) > 0.95).float()
    g2 = (g1 + perm_noise).clamp(max=1)
    optimizer.zero_grad()
    loss = criterion(model(g1, g2))
    loss.backward()
    optimizer.step()
print("loss", loss.item())
