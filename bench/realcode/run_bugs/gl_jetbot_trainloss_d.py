"""Road-follower regression training whose epoch loss sum keeps every batch's graph.

Source: https://github.com/NVIDIA-AI-IOT/jetbot/pull/117 ("Fix GPU memory leaks.")
Original: NVIDIA-AI-IOT/jetbot notebooks/road_following/train_model.ipynb, the "Train Regression" cell
(read at 123eb0b, where the sums already read float(loss); the buggy `train_loss += loss` and
`test_loss += loss` are as the PR describes them).
Bug: the per-epoch sums add the loss tensors themselves, so each training batch's autograd graph stays
reachable from `train_loss` until the epoch ends; the PR wraps them in float().
Ours: random 3x16x16 images and (x, y) targets instead of the collected dataset, a small CNN with the
same 512 -> 2 regression head instead of the pretrained ResNet-18, CPU, fewer epochs.
"""
import torch
import torch.nn.functional as F
import torch.optim as optim

torch.manual_seed(0)


class XYDataset(torch.utils.data.Dataset):
    def __init__(self, n):
        self.images = torch.randn(n, 3, 16, 16)
        self.xy = torch.rand(n, 2) * 2 - 1

    def __len__(self):
        return len(self.images)

    def __getitem__(self, idx):
        return self.images[idx], self.xy[idx]


dataset = XYDataset(400)
test_percent = 0.1
num_test = int(test_percent * len(dataset))
train_dataset, test_dataset = torch.utils.data.random_split(dataset, [len(dataset) - num_test, num_test])
train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=8, shuffle=True, num_workers=1)
test_loader = torch.utils.data.DataLoader(test_dataset, batch_size=8, shuffle=True, num_workers=1)

model = torch.nn.Sequential(
    torch.nn.Conv2d(3, 32, 3, stride=2, padding=1), torch.nn.ReLU(),
    torch.nn.Conv2d(32, 64, 3, stride=2, padding=1), torch.nn.ReLU(),
    torch.nn.Flatten(), torch.nn.Linear(64 * 4 * 4, 512), torch.nn.ReLU(),
)
model.fc = torch.nn.Linear(512, 2)
device = torch.device("cpu")
model = model.to(device)

NUM_EPOCHS = 3
BEST_MODEL_PATH = "/tmp/best_steering_model_xy.pth"
best_loss = 1e9

optimizer = optim.Adam(model.parameters())

for epoch in range(NUM_EPOCHS):

    model.train()
    train_loss = 0.0
    for images, labels in iter(train_loader):
        images = images.to(device)
        labels = labels.to(device)
        optimizer.zero_grad()
        outputs = model(images)
        loss = F.mse_loss(outputs, labels)
        train_loss += loss  # BUG
        loss.backward()
        optimizer.step()
    train_loss /= len(train_loader)

    model.eval()
    test_loss = 0.0
    for images, labels in iter(test_loader):
        images = images.to(device)
        labels = labels.to(device)
        outputs = model(images)
        loss = F.mse_loss(outputs, labels)
        test_loss += loss
    test_loss /= len(test_loader)

    print(f"{float(train_loss):f}, {float(test_loss):f}")
    if test_loss < best_loss:
        torch.save(model.state_dict(), BEST_MODEL_PATH)
        best_loss = test_loss
