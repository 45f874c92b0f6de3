# Source: https://github.com/k2-fsa/snowfall/issues/110 (fixed by k2-fsa/snowfall#111)
# Original: k2-fsa/snowfall snowfall/common.py (save_checkpoint) and snowfall/models/transformer.py (Noam), as
# used by the egs/librispeech training scripts
# Bug: save_checkpoint stores the model's weights, the epoch and the learning rate but not the optimizer: the
# Noam wrapper's step count (which sets its warmup learning rate) and Adam's moments are lost, so training
# restarted from an intermediate epoch begins the warmup again from step 0.
import os
import tempfile

import torch
import torch.nn.functional as F

torch.manual_seed(0)


class Noam:
    def __init__(self, params, model_size=64, factor=5.0, warm_step=24):
        self.optimizer = torch.optim.Adam(params, lr=0, betas=(0.9, 0.98), eps=1e-9)
        self._step, self.warmup, self.factor, self.model_size, self._rate = 0, warm_step, factor, model_size, 0

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    def step(self):
        self._step += 1
        rate = self.rate()
        for p in self.optimizer.param_groups:
            p["lr"] = rate
        self._rate = rate
        self.optimizer.step()

    def rate(self, step=None):
        step = self._step if step is None else step
        return self.factor * self.model_size ** (-0.5) * min(step ** (-0.5), step * self.warmup ** (-1.5))

    def zero_grad(self):
        self.optimizer.zero_grad()

    def state_dict(self):
        return {"_step": self._step, "warmup": self.warmup, "factor": self.factor, "model_size": self.model_size,
                "_rate": self._rate, "optimizer": self.optimizer.state_dict()}


class AcousticModel(torch.nn.Module):
    def __init__(self, num_features=20, num_classes=12, d_model=64):
        super().__init__()
        self.num_features, self.num_classes, self.subsampling_factor = num_features, num_classes, 1
        self.encoder = torch.nn.GRU(num_features, d_model, batch_first=True)
        self.output = torch.nn.Linear(d_model, num_classes)

    def forward(self, x):
        return self.output(self.encoder(x)[0]).log_softmax(-1)


def save_checkpoint(filename, model, epoch, learning_rate, objf, valid_objf, global_batch_idx_train, local_rank=0):
    if local_rank is not None and local_rank != 0:
        return
    checkpoint = {
        "state_dict": model.state_dict(),
        "epoch": epoch,
        "learning_rate": learning_rate,
        "objf": objf,
        "valid_objf": valid_objf,
        "global_batch_idx_train": global_batch_idx_train,
        "num_features": model.num_features,
        "num_classes": model.num_classes,
        "subsampling_factor": model.subsampling_factor,
    }
    torch.save(checkpoint, filename)  # BUG


def get_objf(batch, model):
    feats, targets, target_lengths = batch
    log_probs = model(feats).transpose(0, 1)
    input_lengths = torch.full((feats.shape[0],), feats.shape[1], dtype=torch.long)
    return F.ctc_loss(log_probs, targets, input_lengths, target_lengths, zero_infinity=True)


def train_one_epoch(dataloader, model, optimizer, global_batch_idx_train):
    model.train()
    total_objf = 0.0
    for batch in dataloader:
        global_batch_idx_train += 1
        loss = get_objf(batch, model)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_value_(model.parameters(), 5.0)
        optimizer.step()
        total_objf += loss.item()
    return total_objf / len(dataloader), global_batch_idx_train


def make_batches(n):
    batches = []
    for _ in range(n):
        targets = torch.randint(1, 12, (8, 6))
        feats = torch.randn(8, 30, 20) + F.one_hot(targets.repeat_interleave(5, 1), 20).float()
        batches.append((feats, targets, torch.full((8,), 6, dtype=torch.long)))
    return batches


exp_dir = tempfile.mkdtemp()
model = AcousticModel()
optimizer = Noam(model.parameters())
train_dl, valid_dl = make_batches(12), make_batches(3)
global_batch_idx_train = 0
for epoch in range(3):
    objf, global_batch_idx_train = train_one_epoch(train_dl, model, optimizer, global_batch_idx_train)
    model.eval()
    with torch.no_grad():
        valid_objf = sum(get_objf(b, model).item() for b in valid_dl) / len(valid_dl)
    save_checkpoint(filename=os.path.join(exp_dir, f"epoch-{epoch}.pt"), model=model, epoch=epoch,
                    learning_rate=optimizer._rate, objf=objf, valid_objf=valid_objf,
                    global_batch_idx_train=global_batch_idx_train)
    print(f"epoch {epoch} objf {objf:.4f} valid_objf {valid_objf:.4f} lr {optimizer._rate:.2e}")
