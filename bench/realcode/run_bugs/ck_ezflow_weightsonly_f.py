# Source: https://github.com/neu-vi/ezflow/issues/63 ("Save optimizer and scheduler state as well along with model
#   state while training"; closed by the consolidated checkpoint of ezflow/engine/trainer.py)
# Original: neu-vi/ezflow ezflow/engine/trainer.py (Trainer._setup_training builds the optimizer and scheduler from the
#   config, Trainer._train_model saves `self.model_name + "_epochs" + str(epochs + 1) + ".pth"` every CKPT_INTERVAL
#   epochs, train(start_epoch=...) to continue)
# Bug: the periodic checkpoint is the model's state_dict alone; continuing a run means loading those weights and
# calling train(start_epoch=...), which builds a fresh AdamW and a fresh OneCycleLR: the moments restart at zero and
# the one-cycle warm-up runs again on a half-trained model.
import os
import subprocess
import sys
import tempfile
from copy import deepcopy

import torch
import torch.nn as nn

CKPT_DIR = sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp()


class Cfg:
    EPOCHS = 3
    CKPT_INTERVAL = 1
    LR = 3e-4
    STEPS_PER_EPOCH = 10
    CKPT_DIR = CKPT_DIR


class FlowNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(nn.Conv2d(6, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 2, 3, padding=1))

    def forward(self, img1, img2):
        return self.enc(torch.cat([img1, img2], dim=1))


def endpointerror(pred, target):
    return torch.norm(pred - target, p=2, dim=1).mean()


class Trainer:
    def __init__(self, cfg, model, train_loader):
        self.cfg = cfg
        self.model = model
        self.model_name = model.__class__.__name__.lower()
        self.train_loader = train_loader

    def _setup_training(self, loss_fn=None, optimizer=None, scheduler=None):
        loss_fn = loss_fn or endpointerror
        if optimizer is None:
            optimizer = torch.optim.AdamW(self.model.parameters(), lr=self.cfg.LR, weight_decay=1e-4)
        if scheduler is None:
            scheduler = torch.optim.lr_scheduler.OneCycleLR(
                optimizer, max_lr=self.cfg.LR, total_steps=self.cfg.STEPS_PER_EPOCH * 8, pct_start=0.25)
        return loss_fn, optimizer, scheduler

    def _train_model(self, loss_fn, optimizer, scheduler, n_epochs, start_epoch=None):
        model = self.model
        best_model = deepcopy(model)
        model.train()
        start_epoch = start_epoch or 0
        lrs = []
        for epochs in range(start_epoch, start_epoch + n_epochs):
            for (img1, img2), target in self.train_loader:
                loss = loss_fn(model(img1, img2), target)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                scheduler.step()
                lrs.append(optimizer.param_groups[0]["lr"])
            if epochs % self.cfg.CKPT_INTERVAL == 0:
                torch.save(model.state_dict(), os.path.join(  # BUG
                    self.cfg.CKPT_DIR, self.model_name + "_epochs" + str(epochs + 1) + ".pth"))
        return best_model, lrs

    def train(self, loss_fn=None, optimizer=None, scheduler=None, n_epochs=None, start_epoch=None):
        loss_fn, optimizer, scheduler = self._setup_training(loss_fn, optimizer, scheduler)
        best_model, lrs = self._train_model(loss_fn, optimizer, scheduler, n_epochs or self.cfg.EPOCHS, start_epoch)
        torch.save(best_model.state_dict(), os.path.join(self.cfg.CKPT_DIR, self.model_name + "_best_final.pth"))
        return lrs


def loader(seed):
    g = torch.Generator().manual_seed(seed)
    return [((torch.randn(4, 3, 16, 16, generator=g), torch.randn(4, 3, 16, 16, generator=g)),
             torch.randn(4, 2, 16, 16, generator=g)) for _ in range(Cfg.STEPS_PER_EPOCH)]


if len(sys.argv) > 1 and sys.argv[1] == "--first-job":
    torch.manual_seed(1)
    Trainer(Cfg, FlowNet(), loader(1)).train()
    sys.exit(0)

subprocess.run([sys.executable, __file__, "--first-job", CKPT_DIR], check=True,
               env={k: v for k, v in os.environ.items() if not k.startswith("TORCHDOCTOR")})
torch.manual_seed(0)
model = FlowNet()
model.load_state_dict(torch.load(os.path.join(CKPT_DIR, "flownet_epochs3.pth"), map_location="cpu"))
trainer = Trainer(Cfg, model, loader(2))
lrs = trainer.train(start_epoch=3)
print(f"continued from epoch 3: LR at the first continued step {lrs[0]:.2e} (the one-cycle warm-up again; "
      f"where the first job stopped it was past its peak {Cfg.LR:.0e}); checkpoint keys: "
      f"{list(torch.load(os.path.join(CKPT_DIR, 'flownet_epochs6.pth')))[:2]}...")
