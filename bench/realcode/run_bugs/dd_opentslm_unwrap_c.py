# Source: https://github.com/OpenTSLM/OpenTSLM/pull/49
# Original: OpenTSLM/OpenTSLM curriculum_learning.py (CurriculumTrainer._get_model, the training step)
# Bug: the model is wrapped in DDP, but every training step computes the loss through _get_model(), which
# returns the unwrapped module; DDP's forward never runs, so its reducer never all-reduces and each rank trains
# its own replica on its own shard.
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)


class TimeSeriesLM(torch.nn.Module):
    def __init__(self, vocab=64, dim=32, patch=8):
        super().__init__()
        self.encoder = torch.nn.Linear(patch, dim)
        self.embed = torch.nn.Embedding(vocab, dim)
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, series, tokens):
        ctx = self.encoder(series).mean(1, keepdim=True)
        return self.head(torch.tanh(self.embed(tokens) + ctx))

    def compute_loss(self, batch):
        series, tokens = batch
        logits = self(series, tokens[:, :-1])
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), tokens[:, 1:].reshape(-1))


class CurriculumTrainer:
    def __init__(self, model):
        self.model = DDP(model)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-3)

    def _get_model(self):
        return self.model.module if isinstance(self.model, DDP) else self.model

    def train_stage(self, loader, epochs):
        for epoch in range(epochs):
            loader.sampler.set_epoch(epoch)
            for batch in loader:
                self.optimizer.zero_grad()
                loss = self._get_model().compute_loss(batch)  # BUG
                loss.backward()
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
                self.optimizer.step()
        return loss.item()


series = torch.randn(256, 4, 8)
tokens = torch.randint(0, 64, (256, 12))
dataset = TensorDataset(series, tokens)
loader = DataLoader(dataset, batch_size=16, sampler=DistributedSampler(dataset))
trainer = CurriculumTrainer(TimeSeriesLM())
print("rank", rank, "loss", trainer.train_stage(loader, epochs=3))
dist.barrier()
dist.destroy_process_group()
