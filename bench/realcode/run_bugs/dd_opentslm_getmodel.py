# Source: https://github.com/OpenTSLM/OpenTSLM/pull/49
# Original: OpenTSLM/OpenTSLM curriculum_learning.py (CurriculumTrainer: _initialize_model, _get_model, the train loop)
# Bug: the trainer wraps the model in DDP, but each training step computes the loss through `_get_model()`,
# which returns `self.model.module` (the unwrapped model, meant for saving); DDP's forward never runs, no
# gradient is all-reduced, and each rank trains its own replica on its shard.
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)


class TimeSeriesLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU())
        self.head = torch.nn.Linear(32, 5)

    def forward(self, series):
        return self.head(self.encoder(series))

    def compute_loss(self, batch):
        return F.cross_entropy(self(batch["series"]), batch["label"])


class CurriculumTrainer:
    def __init__(self, rank):
        self.rank = rank
        self.model = self._initialize_model()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-3)

    def _initialize_model(self):
        return DDP(TimeSeriesLM())

    def _get_model(self):
        return self.model.module if isinstance(self.model, DDP) else self.model

    def _save_checkpoint(self, path):
        if self.rank == 0:
            torch.save(self._get_model().state_dict(), path)

    def _train_stage(self, batches):
        self.model.train()
        for batch in batches:
            self.optimizer.zero_grad()
            loss = self._get_model().compute_loss(batch)  # BUG
            loss.backward()
            self.optimizer.step()


g = torch.Generator().manual_seed(100 + rank)
trainer = CurriculumTrainer(rank)
for stage in range(3):
    batches = [{"series": torch.randn(8, 16, generator=g), "label": torch.randint(0, 5, (8,), generator=g)}
               for _ in range(12)]
    trainer._train_stage(batches)
dist.destroy_process_group()
