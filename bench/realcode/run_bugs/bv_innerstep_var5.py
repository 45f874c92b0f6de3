# Variant of bv_bist_testloss (same bug, another shape; written for torchdoctor's dev set, no public source of its own)
# Bug: the model trains through nn.DataParallel; the validation helper is handed the wrapped network
# (model.module) and, copied from the training step, backpropagates and steps the optimizer on every validation
# batch in eval mode.
import torch
import torch.nn as nn

torch.manual_seed(0)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Linear(10, 40), nn.BatchNorm1d(40), nn.ReLU())
        self.head = nn.Sequential(nn.Dropout(0.2), nn.Linear(40, 3))

    def forward(self, x):
        return self.head(self.features(x))


def validate(net, loader, crit, opt):
    net.eval()
    correct = 0
    for x, y in loader:
        out = net(x)
        loss = crit(out, y)
        opt.zero_grad()
        loss.backward()  # BUG
        opt.step()
        correct += int((out.argmax(1) == y).sum())
    return correct / sum(len(y) for _, y in loader)


model = nn.DataParallel(Net())
crit = nn.CrossEntropyLoss()
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
train = [(torch.randn(24, 10), torch.randint(0, 3, (24,))) for _ in range(12)]
val = [(torch.randn(24, 10), torch.randint(0, 3, (24,))) for _ in range(3)]
for epoch in range(4):
    model.train()
    for x, y in train:
        opt.zero_grad()
        crit(model(x), y).backward()
        opt.step()
    print(f"epoch {epoch} val acc {validate(model.module, val, crit, opt):.3f}")
