"""PyText trainer whose model.train_batch runs the forward on the wrapped module, bypassing DistributedDataParallel.

Source: https://github.com/facebookresearch/pytext/pull/537 ("Fix DDP for new model": "New model /
trainer wraps the call to model.forward in model.train_batch. This skips the call to DDP model's forward
call and breaks distributed training."; landed through Phabricator D15170830)
Original: facebookresearch/pytext pytext/models/new_model.py (Model.train_batch, read at 1ce004d) and
pytext/models/distributed_model.py (DistributedModel, whose __getattr__ hands out the wrapped module's
attributes; read at 1978c7d); the trainer's call `model.train_batch(batch)` on the DistributedModel.
Bug: `state.model.train_batch(batch)` resolves through DistributedModel.__getattr__ to the inner
module's method, so `self(*model_inputs)` calls the inner module, not DistributedDataParallel.forward;
DDP's reducer is never armed, gradients are not all-reduced and each rank steps on its own data.
The fix turned train_batch into a classmethod that receives (and calls) the DDP-wrapped model.
Ours: a bag-of-embeddings doc classifier with PyText's arrange_model_inputs / get_loss / get_pred
contract, random token batches that differ per rank, the trainer reduced to its step; run with
torchrun --nproc-per-node 2 (gloo, CPU).
"""
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class DistributedModel(nn.parallel.DistributedDataParallel):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)

    def __getattr__(self, name):
        wrapped_module = super().__getattr__("module")
        if hasattr(wrapped_module, name):
            return getattr(wrapped_module, name)
        return super().__getattr__(name)


class DocModel(nn.Module):
    def __init__(self, vocab=100, dim=32, num_labels=4):
        super().__init__()
        self.embedding = nn.EmbeddingBag(vocab, dim)
        self.representation = nn.Sequential(nn.Linear(dim, dim), nn.ReLU())
        self.decoder = nn.Linear(dim, num_labels)

    def arrange_model_inputs(self, batch):
        return (batch["tokens"],)

    def arrange_targets(self, batch):
        return batch["labels"]

    def forward(self, tokens):
        return self.decoder(self.representation(self.embedding(tokens)))

    def get_loss(self, logits, targets, context):
        return F.cross_entropy(logits, targets)

    def get_pred(self, logits):
        scores = F.softmax(logits, 1)
        return scores.argmax(1), scores

    def train_batch(self, batch):
        model_inputs = self.arrange_model_inputs(batch)
        model_outputs = self(*model_inputs)  # BUG
        loss = self.get_loss(model_outputs, self.arrange_targets(batch), None)
        predictions, scores = self.get_pred(model_outputs)
        targets = self.arrange_targets(batch)
        metric_data = (predictions, targets, scores, loss, model_inputs)
        return loss, metric_data


def train(model, optimizer, batches):
    model.train()
    for batch in batches:
        optimizer.zero_grad()
        loss, metric_data = model.train_batch(batch)
        loss.backward()
        optimizer.step()
    return loss


dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DistributedModel(DocModel())
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
g = torch.Generator().manual_seed(100 + rank)
batches = [{"tokens": torch.randint(0, 100, (16, 12), generator=g), "labels": torch.randint(0, 4, (16,), generator=g)}
           for _ in range(30)]
for epoch in range(2):
    loss = train(model, optimizer, batches)
    if rank == 0:
        print(f"epoch {epoch} loss {loss.item():.4f}")
dist.destroy_process_group()
