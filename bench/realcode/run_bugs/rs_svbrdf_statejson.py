# Source: https://github.com/mworchel/svbrdf-estimation/issues/31
# Original: mworchel/svbrdf-estimation development/multiImage_pytorch/main.py, read at e04d7ae (the parent of
# 2115bf6, "Add full checkpoint saving/loading mechanism")
# Bug: a continued run restores the weights from model.data and the epoch from state.json, but neither file holds
# the optimizer's state: the Adam built afresh for the resumed epochs starts with zero moments and step count.
import json
import math
import os
import subprocess
import sys
import tempfile

import torch

torch.manual_seed(0)


class SingleViewModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.LeakyReLU(0.2),
                                           torch.nn.Conv2d(16, 16, 3, padding=1), torch.nn.LeakyReLU(0.2))
        self.decoder = torch.nn.Conv2d(16, 9, 3, padding=1)

    def forward(self, x):
        return torch.tanh(self.decoder(self.encoder(x)))


class MixedLoss(torch.nn.Module):
    def forward(self, outputs, targets):
        return torch.nn.functional.l1_loss(outputs, targets)


class SvbrdfDataset(torch.utils.data.Dataset):
    def __init__(self, n=96):
        g = torch.Generator().manual_seed(1)
        self.inputs = torch.rand(n, 3, 16, 16, generator=g)
        mix = torch.randn(9, 3, generator=g)
        self.svbrdf = torch.tanh(torch.einsum("oc,nchw->nohw", mix, self.inputs))

    def __len__(self):
        return len(self.inputs)

    def __getitem__(self, i):
        return {"inputs": self.inputs[i], "svbrdf": self.svbrdf[i]}


def main(model_dir, epochs, retrain=False):
    model = SingleViewModel()
    training_state = {"epoch": 0}
    training_state_path = os.path.join(model_dir, "state.json")
    model_path = os.path.join(model_dir, "model.data")
    if os.path.exists(model_path):
        if not retrain:
            model.load_state_dict(torch.load(model_path))  # BUG
    if os.path.exists(training_state_path) and not retrain:
        with open(training_state_path) as f:
            training_state = json.load(f)
        print(f"Loaded training state: {str(training_state):s}.")

    training_data = SvbrdfDataset()
    training_dataloader = torch.utils.data.DataLoader(training_data, batch_size=8, shuffle=True)
    batch_count = int(math.ceil(len(training_data) / training_dataloader.batch_size))
    epoch_start = training_state["epoch"]
    epoch_end = epochs
    print(f"Training from epoch {epoch_start:d} to {epoch_end:d}")

    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_function = MixedLoss()
    model.train(True)
    for epoch in range(epoch_start, epoch_end):
        for i, batch in enumerate(training_dataloader):
            batch_index = epoch * batch_count + i
            optimizer.zero_grad()
            outputs = model(batch["inputs"])
            loss = loss_function(outputs, batch["svbrdf"])
            loss.backward()
            optimizer.step()
        print(f"Epoch {epoch + 1:d}, batch {batch_index + 1:d}, loss: {loss.item():f}")
        torch.save(model.state_dict(), model_path)
        training_state["epoch"] = epoch + 1
        with open(training_state_path, "w") as f:
            json.dump(training_state, f)
    model.train(False)
    torch.save(model.state_dict(), model_path)
    training_state["epoch"] = epoch_end
    with open(training_state_path, "w") as f:
        json.dump(training_state, f)


if len(sys.argv) > 1 and sys.argv[1] == "first-job":  # the interrupted run (its own process): 3 of 6 epochs
    main(sys.argv[2], epochs=3)
    sys.exit(0)
model_dir = tempfile.mkdtemp()
subprocess.run([sys.executable, __file__, "first-job", model_dir], check=True,
               env={k: v for k, v in os.environ.items() if not k.startswith("TORCHDOCTOR")})
main(model_dir, epochs=6)
