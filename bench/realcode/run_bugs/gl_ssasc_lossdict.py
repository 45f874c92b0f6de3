# Source: https://github.com/jokester-zzz/SSA-SC/issues/2
# Original: jokester-zzz/SSA-SC train.py (the epoch loop inherited from LMSCNet), model.compute_loss
# Bug: the epoch's per-key loss sums add each batch's loss[key] tensor, not loss[key].item(), so the
# dict of running sums keeps every batch's autograd graph alive and memory rises all epoch.
import torch
import torch.nn.functional as F

torch.manual_seed(0)


class SSCNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.seg = torch.nn.Sequential(torch.nn.Conv3d(4, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv3d(16, 5, 1))

    def forward(self, voxels):
        return self.seg(voxels)

    def compute_loss(self, scores, labels):
        ce = F.cross_entropy(scores, labels)
        occupied = (labels > 0).float()
        geo = F.binary_cross_entropy_with_logits(scores[:, 1:].amax(1), occupied)
        return {"total": ce + geo, "semantic": ce, "geometry": geo}


model = SSCNet()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
batches = [(torch.randn(2, 4, 8, 8, 8), torch.randint(0, 5, (2, 8, 8, 8))) for _ in range(40)]
for epoch in range(2):
    epoch_loss = {"total": 0.0, "semantic": 0.0, "geometry": 0.0}
    for voxels, labels in batches:
        scores = model(voxels)
        loss = model.compute_loss(scores, labels)
        optimizer.zero_grad()
        loss["total"].backward()
        optimizer.step()
        for key in loss:
            epoch_loss[key] += loss[key]  # BUG
    print(epoch, {key: round(float(value) / len(batches), 4) for key, value in epoch_loss.items()})
