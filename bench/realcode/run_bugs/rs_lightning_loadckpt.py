# Source: https://github.com/Lightning-AI/pytorch-lightning/issues/12280
# Original: the LightningModule and resume code of the issue thread (PlModel, trainer.fit without ckpt_path)
# Bug: the resumed run restores the module with LightningModule.load_from_checkpoint() and calls
# trainer.fit(model) without ckpt_path: the checkpoint's optimizer_states are never loaded, so Adam
# restarts with empty moments (and the epoch count from 0) on weights trained for several epochs.
import os
import subprocess
import sys
import tempfile

import lightning as L
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

ckpt_dir = tempfile.mkdtemp()
ckpt_path = os.path.join(ckpt_dir, "last.ckpt")


class PlModel(L.LightningModule):
    def __init__(self, lr=1e-3):
        super().__init__()
        self.save_hyperparameters()
        self.model = torch.nn.Sequential(torch.nn.Linear(12, 48), torch.nn.ReLU(), torch.nn.Linear(48, 3))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.model(x), y)
        self.log("train_loss", loss, prog_bar=False)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


def loader(seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(256, 12, generator=g)
    return DataLoader(TensorDataset(x, (x[:, :3].argmax(1))), batch_size=32, shuffle=True)


def trainer(epochs):
    return L.Trainer(max_epochs=epochs, accelerator="cpu", logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "first-job":
        torch.manual_seed(0)
        t = trainer(3)
        t.fit(PlModel(), loader(0))
        t.save_checkpoint(ckpt_path if len(sys.argv) < 3 else sys.argv[2])
        sys.exit(0)
    # The earlier job, in its own process as a resumed job is.
    subprocess.run([sys.executable, __file__, "first-job", ckpt_path], check=True,
                   env={k: v for k, v in os.environ.items() if not k.startswith("TORCHDOCTOR")})
    print("checkpoint keys:", sorted(torch.load(ckpt_path, weights_only=False).keys()))
    model = PlModel.load_from_checkpoint(ckpt_path)  # BUG
    t = trainer(6)
    t.fit(model, loader(1))
    print("resumed; optimizer state entries:", len(t.optimizers[0].state))
