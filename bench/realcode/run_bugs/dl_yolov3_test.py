# Source: https://github.com/ultralytics/yolov3/pull/688
# Original: ultralytics/yolov3 test.py (test), called from train.py's epoch loop
# Bug: test(), called every epoch from train(), rebuilds the validation dataset and a multi-worker
# DataLoader each time; the fix builds the test loader once in train() and passes it in.
import torch
from torch.utils.data import DataLoader, Dataset

torch.manual_seed(0)


class LoadImagesAndLabels(Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(1)
        self.imgs = torch.randn(n, 3, 16, 16, generator=g)
        self.labels = torch.randint(0, 5, (n,), generator=g)

    def __len__(self):
        return len(self.imgs)

    def __getitem__(self, i):
        return self.imgs[i], self.labels[i]


def test(model, batch_size=16):
    dataset = LoadImagesAndLabels(64)
    dataloader = DataLoader(dataset, batch_size=batch_size, num_workers=2, pin_memory=True)  # BUG
    model.eval()
    correct = 0
    with torch.no_grad():
        for imgs, targets in dataloader:
            correct += (model(imgs).argmax(1) == targets).sum().item()
    return correct / len(dataset)


def train(epochs=4):
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                                torch.nn.Flatten(), torch.nn.Linear(8, 5))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    dataloader = DataLoader(LoadImagesAndLabels(128), batch_size=16, shuffle=True)
    for epoch in range(epochs):
        model.train()
        for imgs, targets in dataloader:
            loss = torch.nn.functional.cross_entropy(model(imgs), targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        print("epoch", epoch, "mAP-ish", test(model))


if __name__ == "__main__":
    train()
