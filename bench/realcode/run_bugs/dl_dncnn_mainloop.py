# Source: https://github.com/cszn/DnCNN/issues/96
# Original: cszn/DnCNN TrainingCodes/dncnn_pytorch/main_train.py (the epoch loop) and data_generator.py
# Bug: every epoch regenerates the clean patches, builds a new Dataset and a new DataLoader with worker
# processes; the noise is drawn in __getitem__ anyway, so nothing changes between epochs except the cost of
# the rebuild and the new workers' start-up. (Workers 2 here, 4 in the original; the patch generator is ours.)
import torch
from torch.utils.data import DataLoader, Dataset

torch.manual_seed(0)


def datagenerator(n_images=8, patch_size=20, stride=10):
    g = torch.Generator().manual_seed(5)
    patches = []
    for _ in range(n_images):
        img = torch.rand(1, 60, 60, generator=g)
        for i in range(0, 60 - patch_size + 1, stride):
            for j in range(0, 60 - patch_size + 1, stride):
                patches.append(img[:, i:i + patch_size, j:j + patch_size])
    return torch.stack(patches)


class DenoisingDataset(Dataset):
    def __init__(self, xs, sigma):
        self.xs, self.sigma = xs, sigma

    def __getitem__(self, index):
        batch_x = self.xs[index]
        noise = torch.randn(batch_x.size()).mul_(self.sigma / 255.0)
        return batch_x + noise, batch_x

    def __len__(self):
        return self.xs.size(0)


class DnCNN(torch.nn.Module):
    def __init__(self, depth=4, n_channels=8):
        super().__init__()
        layers = [torch.nn.Conv2d(1, n_channels, 3, padding=1), torch.nn.ReLU(inplace=True)]
        for _ in range(depth - 2):
            layers += [torch.nn.Conv2d(n_channels, n_channels, 3, padding=1, bias=False),
                       torch.nn.BatchNorm2d(n_channels), torch.nn.ReLU(inplace=True)]
        layers.append(torch.nn.Conv2d(n_channels, 1, 3, padding=1))
        self.dncnn = torch.nn.Sequential(*layers)

    def forward(self, x):
        return x - self.dncnn(x)


if __name__ == "__main__":
    sigma, batch_size, n_epoch = 25, 32, 4
    model = DnCNN()
    model.train()
    criterion = torch.nn.MSELoss(reduction="sum")
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for epoch in range(n_epoch):
        xs = datagenerator()
        DDataset = DenoisingDataset(xs, sigma)
        DLoader = DataLoader(dataset=DDataset, num_workers=2, drop_last=True, batch_size=batch_size, shuffle=True)  # BUG
        epoch_loss = 0
        for n_count, batch_yx in enumerate(DLoader):
            optimizer.zero_grad()
            batch_y, batch_x = batch_yx
            loss = criterion(model(batch_y), batch_x) / 2
            epoch_loss += loss.item()
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch + 1} loss {epoch_loss / (n_count + 1):.4f}")
