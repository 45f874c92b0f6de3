# Source: synthetic: state 2 of run14 (plain state_dict files per epoch, the run continued from the last one)
# Original: our own; `torch.save(model.state_dict(), f"{out}/model_epoch{epoch}.pt")` and a --resume-from flag
# Bug: each epoch writes only model.state_dict(); continuing from the last file restores the weights into a new
# model and builds a new RMSprop (its square averages and momentum start at zero), and the run then writes the
# same model_epoch<N>.pt series again.
import os
import tempfile

import torch
import torch.nn.functional as F

out = tempfile.mkdtemp()


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Conv1d(2, 8, 3, padding=1), torch.nn.ReLU())
        self.head = torch.nn.Linear(8 * 16, 4)

    def forward(self, x):
        return self.head(self.body(x).flatten(1))


def run(first_epoch, last_epoch, resume_from=None):
    torch.manual_seed(first_epoch)
    net = Net()
    if resume_from is not None:
        net.load_state_dict(torch.load(resume_from))  # BUG
    opt = torch.optim.RMSprop(net.parameters(), lr=1e-3, momentum=0.5)
    for epoch in range(first_epoch, last_epoch):
        for _ in range(6):
            x, y = torch.randn(8, 2, 16), torch.randint(0, 4, (8,))
            opt.zero_grad()
            F.cross_entropy(net(x), y).backward()
            opt.step()
        torch.save(net.state_dict(), os.path.join(out, f"model_epoch{epoch}.pt"))
    print(f"epochs {first_epoch}..{last_epoch - 1} done")


run(0, 3)
run(3, 6, resume_from=os.path.join(out, "model_epoch2.pt"))
