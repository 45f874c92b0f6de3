# Source: https://github.com/Pointcept/Pointcept/pull/530
# Original: Pointcept/Pointcept pointcept/datasets/transform.py (the color normalisation transform)
# Bug: the transform rescales each scene's colors by (color - lo) / (hi - lo); a scene without color information
# (all zeros) has hi == lo, the division is 0/0 and the batch that holds it reaches the model as nan.
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

torch.manual_seed(0)


class NormalizeColor:
    def __call__(self, data_dict):
        color = data_dict["color"]
        lo, hi = color.min(dim=0).values, color.max(dim=0).values
        data_dict["color"] = (color - lo) / (hi - lo) * 2 - 1  # BUG
        return data_dict


class Compose:
    def __init__(self, transforms):
        self.transforms = transforms

    def __call__(self, data_dict):
        for t in self.transforms:
            data_dict = t(data_dict)
        return data_dict


class ScanDataset(Dataset):
    def __init__(self, n_scenes, n_points, transform):
        g = torch.Generator().manual_seed(1)
        self.scenes = []
        for i in range(n_scenes):
            coord = torch.randn(n_points, 3, generator=g)
            has_color = i % 7 != 5  # some scans were captured without an RGB camera
            color = torch.rand(n_points, 3, generator=g) * 255 if has_color else torch.zeros(n_points, 3)
            segment = (coord[:, 2] > 0).long() + (coord[:, 0] > 0).long()
            self.scenes.append({"coord": coord, "color": color, "segment": segment})
        self.transform = transform

    def __len__(self):
        return len(self.scenes)

    def __getitem__(self, idx):
        data = {k: v.clone() for k, v in self.scenes[idx].items()}
        data = self.transform(data)
        return torch.cat([data["coord"], data["color"]], dim=1), data["segment"]


dataset = ScanDataset(n_scenes=40, n_points=64, transform=Compose([NormalizeColor()]))
loader = DataLoader(dataset, batch_size=4, shuffle=False)
model = torch.nn.Sequential(torch.nn.Linear(6, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                            torch.nn.Linear(64, 3))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for epoch in range(2):
    for feat, segment in loader:
        logits = model(feat)
        loss = F.cross_entropy(logits.reshape(-1, 3), segment.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print("epoch", epoch, "loss", loss.item())
