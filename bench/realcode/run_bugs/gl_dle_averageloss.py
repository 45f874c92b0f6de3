# Source: https://github.com/NVIDIA/DeepLearningExamples/issues/1102 (fixed by PR #1104)
# Original: NVIDIA/DeepLearningExamples PyTorch/LanguageModeling/BERT run_pretraining.py (the training-stats object)
# Bug: the training loop adds each step's loss into a device-side running statistic with an in-place add_; the
# statistic becomes part of every step's autograd graph and keeps them all alive, so host memory grows step after
# step (the reporter's RAM kept growing until the machine stalled; fixed with loss.clone().detach()).
import torch
import torch.nn.functional as F

torch.manual_seed(0)


class SyncFreeStats:
    def __init__(self):
        self.device_stats = {}
        self.host_stats = {}

    def add_stat(self, name, dtype=torch.float32, init=0):
        self.device_stats[name] = torch.zeros(1, dtype=dtype).fill_(init)
        self.host_stats[name] = float(init)

    def device_stat(self, name):
        return self.device_stats[name]

    def host_stat(self, name):
        self.host_stats[name] = self.device_stats[name].item()
        return self.host_stats[name]


class TinyBert(torch.nn.Module):
    def __init__(self, vocab=64, dim=32):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, dim)
        self.layer = torch.nn.TransformerEncoderLayer(dim, 4, 64, dropout=0.1, batch_first=True)
        self.mlm = torch.nn.Linear(dim, vocab)

    def forward(self, ids):
        return self.mlm(self.layer(self.emb(ids)))


def take_optimizer_step(optimizer, model, stats):
    optimizer.step()
    for p in model.parameters():
        p.grad = None


model = TinyBert()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
stats = SyncFreeStats()
stats.add_stat("average_loss")
g = torch.Generator().manual_seed(1)
log_freq = 40
for global_step in range(1, 121):
    ids = torch.randint(0, 64, (8, 16), generator=g)
    loss = F.cross_entropy(model(ids).reshape(-1, 64), ids.reshape(-1))
    loss.backward()
    stats.device_stat("average_loss").add_(loss)  # BUG
    take_optimizer_step(optimizer, model, stats)
    if global_step % log_freq == 0:
        print("step", global_step, "average_loss %.4f" % (stats.host_stat("average_loss") / global_step))
