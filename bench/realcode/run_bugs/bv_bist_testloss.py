# Source: https://github.com/salesforce/BiST/issues/2
# Original: salesforce/BiST model/optimize.py (SimpleLossCompute, NoamOpt) and train.py (run_epoch for train and
# valid each epoch)
# Bug: the loss-compute object calls loss.backward() for every batch, also when it was built without an optimizer
# for the validation epoch; nothing clears those gradients (the optimizer is zeroed only after its own step), so the
# first training step of the next epoch applies the validation set's summed gradients.
import torch
import torch.nn as nn

torch.manual_seed(0)
VOCAB, DIM = 40, 32


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(DIM, VOCAB)

    def forward(self, x):
        return torch.log_softmax(self.proj(x), dim=-1)


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.body = nn.Sequential(nn.Linear(DIM, DIM), nn.ReLU(), nn.Dropout(0.1), nn.Linear(DIM, DIM))

    def forward(self, src):
        return self.body(self.embed(src))


class NoamOpt:
    """Optim wrapper that sets the rate at each step."""

    def __init__(self, model_size, factor, warmup, optimizer):
        self.optimizer = optimizer
        self._step = 0
        self.warmup = warmup
        self.factor = factor
        self.model_size = model_size

    def step(self):
        self._step += 1
        rate = self.factor * self.model_size ** -0.5 * min(self._step ** -0.5, self._step * self.warmup ** -1.5)
        for p in self.optimizer.param_groups:
            p["lr"] = rate
        self.optimizer.step()


class SimpleLossCompute:
    def __init__(self, generator, criterion, opt=None):
        self.generator = generator
        self.criterion = criterion
        self.opt = opt

    def __call__(self, ft, batch):
        out = self.generator(ft)
        norm = batch["ntokens"]
        loss = self.criterion(out.reshape(-1, out.size(-1)), batch["trg_y"].reshape(-1)) / norm
        loss.backward()  # BUG
        if self.opt is not None:
            self.opt.step()
            self.opt.optimizer.zero_grad()
        return loss.item() * norm


def make_batches(n):
    out = []
    for _ in range(n):
        src = torch.randint(0, VOCAB, (8, 10))
        out.append({"src": src, "trg_y": (src + 1) % VOCAB, "ntokens": float(src.numel())})
    return out


def run_epoch(data, model, loss_compute):
    total, tokens = 0.0, 0.0
    for batch in data:
        ft = model(batch["src"])
        total += loss_compute(ft, batch)
        tokens += batch["ntokens"]
    return total / tokens


model = Encoder()
generator = Generator()
params = list(model.parameters()) + list(generator.parameters())
opt = NoamOpt(DIM, 1.0, 40, torch.optim.Adam(params, lr=0, betas=(0.9, 0.98), eps=1e-9))
criterion = nn.NLLLoss(reduction="sum")
train_data, valid_data = make_batches(16), make_batches(6)

for epoch in range(4):
    model.train()
    generator.train()
    train_loss = run_epoch(train_data, model, SimpleLossCompute(generator, criterion, opt))
    model.eval()
    generator.eval()
    valid_loss = run_epoch(valid_data, model, SimpleLossCompute(generator, criterion, None))
    print(f"epoch {epoch} train {train_loss:.4f} valid {valid_loss:.4f}")
