# Source: https://github.com/kohya-ss/sd-scripts/pull/120
# Original: kohya-ss/sd-scripts train_network.py (the epoch loop of train())
# Bug: the training data loader (with worker processes) is built again at the start of every epoch by a
# helper called inside the epoch loop; the PR moves the loading out of the loop, since the dataset never
# changes between epochs and each rebuild re-spawns the workers.
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

torch.manual_seed(0)


class LatentsDataset(Dataset):
    def __init__(self, n):
        self.latents = torch.randn(n, 4, 8, 8)

    def __len__(self):
        return len(self.latents)

    def __getitem__(self, i):
        return self.latents[i], torch.randn(4, 8, 8)


def load_train_data(dataset, max_data_loader_n_workers):
    n_workers = min(max_data_loader_n_workers, 2)
    return DataLoader(dataset, batch_size=8, shuffle=True, num_workers=n_workers)  # BUG


unet = torch.nn.Sequential(torch.nn.Conv2d(4, 16, 3, padding=1), torch.nn.SiLU(), torch.nn.Conv2d(16, 4, 3, padding=1))
optimizer = torch.optim.AdamW(unet.parameters(), lr=1e-4)
train_dataset = LatentsDataset(64)
num_train_epochs = 5
global_step = 0
for epoch in range(num_train_epochs):
    print(f"epoch {epoch + 1}/{num_train_epochs}")
    train_dataloader = load_train_data(train_dataset, max_data_loader_n_workers=8)
    unet.train()
    for step, (latents, noise) in enumerate(train_dataloader):
        noisy = latents + noise
        noise_pred = unet(noisy)
        loss = F.mse_loss(noise_pred, noise)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        global_step += 1
print("done")
