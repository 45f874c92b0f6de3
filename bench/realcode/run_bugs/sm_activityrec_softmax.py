# Source: https://github.com/jindongwang/Deep-learning-activity-recognition/issues/10
# Original: jindongwang/Deep-learning-activity-recognition pytorch/main_pytorch.py (Network.forward)
# Bug: the network's forward ends in F.softmax and its output goes to nn.CrossEntropyLoss, which applies
# log_softmax itself: a second softmax that flattens the gradients.
import torch
import torch.nn.functional as F

torch.manual_seed(0)


class Network(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Sequential(torch.nn.Conv2d(9, 16, (1, 9)), torch.nn.ReLU(), torch.nn.MaxPool2d((1, 2)))
        self.fc1 = torch.nn.Sequential(torch.nn.Linear(16 * 28, 64), torch.nn.ReLU())
        self.fc2 = torch.nn.Linear(64, 6)

    def forward(self, x):
        out = self.conv1(x)
        out = out.reshape(out.size(0), -1)
        out = self.fc1(out)
        out = self.fc2(out)
        out = F.softmax(out, dim=1)  # BUG
        return out


model = Network()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
criterion = torch.nn.CrossEntropyLoss()
for epoch in range(2):
    for step in range(15):
        sample = torch.randn(16, 9, 1, 64)
        target = torch.randint(0, 6, (16,))
        output = model(sample)
        loss = criterion(output, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
print("done")
