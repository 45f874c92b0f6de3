# Source: synthetic: state 1 of run14 (a checkpoint holding the optimizer, read back in the same process)
# Original: our own; the layout of pytorch/examples imagenet's checkpoint.pth.tar ({'epoch', 'state_dict', 'optimizer'})
# Bug: the script trains, writes checkpoint.pth.tar and then continues as a resumed job would (fresh model and
# optimizer, --resume pointing at that file): the resume path restores the weights and the epoch but never hands
# the saved optimizer state to the new SGD, so its momentum buffers restart from zero.
import os
import tempfile

import torch
import torch.nn.functional as F

root = tempfile.mkdtemp()
data_gen = torch.Generator().manual_seed(0)
data = [(torch.randn(16, 12, generator=data_gen), torch.randint(0, 3, (16,), generator=data_gen)) for _ in range(6)]


def build():
    return torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3))


def main(epochs, resume=None):
    model = build()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    start_epoch = 0
    if resume:
        checkpoint = torch.load(resume)
        start_epoch = checkpoint["epoch"]
        model.load_state_dict(checkpoint["state_dict"])  # BUG
        print(f"=> loaded checkpoint '{resume}' (epoch {start_epoch})")
    for epoch in range(start_epoch, epochs):
        for x, y in data:
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch} loss {loss.item():.4f}")
    if not resume:
        torch.save({"epoch": epochs, "state_dict": model.state_dict(), "optimizer": optimizer.state_dict()},
                   os.path.join(root, "checkpoint.pth.tar"))
    return optimizer


main(2)
resumed = main(5, resume=os.path.join(root, "checkpoint.pth.tar"))
print("momentum buffers after the resume:", len(resumed.state))
