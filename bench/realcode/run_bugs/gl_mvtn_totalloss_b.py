# Source: https://github.com/ajhamdi/MVTN/issues/2
# Original: ajhamdi/MVTN run_mvtn.py / ops.py (train)
# Bug: the epoch's running loss is summed from the graph-holding loss tensors (total_loss += loss), so every
# batch's graph stays alive until the epoch ends; host memory grows until the job is killed in the second epoch
# (the reporter's fix, which the maintainer applied: total_loss += loss.item()).
import torch
import torch.nn.functional as F

torch.manual_seed(0)
nb_views, n_points, n_classes = 4, 256, 10


class MVTN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.point_feat = torch.nn.Sequential(torch.nn.Linear(3, 64), torch.nn.ReLU(), torch.nn.Linear(64, 128))
        self.regress = torch.nn.Linear(128, 2 * nb_views)

    def forward(self, points):
        return torch.tanh(self.regress(self.point_feat(points).max(1)[0])).view(-1, nb_views, 2) * 3.14


class MVNetwork(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.view_net = torch.nn.Sequential(torch.nn.Linear(3 * n_points, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128))
        self.fc = torch.nn.Linear(128, n_classes)

    def forward(self, points, azim_elev):
        azim, elev = azim_elev[..., 0:1], azim_elev[..., 1:2]
        rot = torch.stack([azim.cos(), azim.sin() * elev.cos(), elev.sin()], -1)
        views = points.unsqueeze(1) * rot
        return self.fc(self.view_net(views.flatten(2)).max(1)[0])


def train(data_loader, mvtn, mvnetwork, optimizer, mvtn_optimizer):
    mvtn.train()
    mvnetwork.train()
    total_loss = 0.0
    n = 0
    for points, targets in data_loader:
        azim_elev = mvtn(points)
        outputs = mvnetwork(points, azim_elev)
        loss = F.cross_entropy(outputs, targets)
        optimizer.zero_grad()
        mvtn_optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        mvtn_optimizer.step()
        total_loss += loss  # BUG
        n += 1
    return total_loss / n


mvtn, mvnetwork = MVTN(), MVNetwork()
optimizer = torch.optim.AdamW(mvnetwork.parameters(), lr=1e-3)
mvtn_optimizer = torch.optim.AdamW(mvtn.parameters(), lr=1e-4)
data = [(torch.randn(16, n_points, 3), torch.randint(0, n_classes, (16,))) for _ in range(40)]
for epoch in range(3):
    avg_loss = train(data, mvtn, mvnetwork, optimizer, mvtn_optimizer)
    print("epoch", epoch, "loss", round(float(avg_loss), 4))
