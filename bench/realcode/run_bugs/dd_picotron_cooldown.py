# Source: https://github.com/huggingface/picotron/pull/5
# Original: huggingface/picotron picotron/pipeline_parallel/pipeline_parallel.py (train_step_pipeline_1f1b)
# Bug: the 1F1B schedule turns gradient sync off before its steady-state loop and turns it back on only
# in the cooldown loop; the last pipeline stage has no warm-up micro-batches, so its cooldown loop is
# empty and no backward of that stage is ever all-reduced: each data-parallel rank steps on its own
# gradients and the replicas drift apart.
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
dp_rank = dist.get_rank()
torch.manual_seed(0)
pp_world_size, pp_rank = 1, 0  # one pipeline stage per rank here: this rank is also the last stage
vocab, seq, micro_bs, grad_acc_steps = 40, 8, 4, 4


class Stage(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = torch.nn.Embedding(vocab, 32)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32))
        self.final_proj = torch.nn.Linear(32, vocab)

    def forward(self, input_ids):
        return self.final_proj(self.mlp(self.embedding(input_ids)))


class MicroBatches:
    def __init__(self, seed):
        self.g = torch.Generator().manual_seed(seed)

    def __next__(self):
        x = torch.randint(0, vocab, (micro_bs, seq + 1), generator=self.g)
        return {"input_ids": x[:, :-1], "target_ids": x[:, 1:]}


def train_step_pipeline_1f1b(model, data_loader):
    num_warmup_microbatches = min(pp_world_size - pp_rank - 1, grad_acc_steps)
    num_microbatches_remaining = grad_acc_steps - num_warmup_microbatches
    logging_loss, outputs = 0.0, []
    requires_grad_sync = dist.get_world_size() > 1

    def _forward_step():
        nonlocal logging_loss
        batch = next(data_loader)
        logits = model(batch["input_ids"])
        loss = F.cross_entropy(logits.transpose(1, 2), batch["target_ids"]) / grad_acc_steps
        logging_loss += loss.item()
        return loss

    for _ in range(num_warmup_microbatches):  # warm-up forwards (none on the last stage)
        outputs.append(_forward_step())
    if requires_grad_sync:
        model.require_backward_grad_sync = False  # BUG
    for _ in range(num_microbatches_remaining):  # 1F1B steady state
        outputs.append(_forward_step())
        outputs.pop(0).backward()
    for i in range(num_warmup_microbatches):  # cooldown backwards: sync on the last one only
        if requires_grad_sync:
            model.require_backward_grad_sync = (i == num_warmup_microbatches - 1)
        outputs.pop(0).backward()
    return logging_loss


model = DDP(Stage())
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
data_loader = MicroBatches(seed=50 + dp_rank)
for step in range(25):
    optimizer.zero_grad()
    loss = train_step_pipeline_1f1b(model, data_loader)
    optimizer.step()
    if dp_rank == 0 and step % 5 == 0:
        print(f"step {step} loss {loss:.4f}")
checksum = torch.stack([p.detach().sum() for p in model.parameters()]).sum().reshape(1)
gathered = [torch.zeros(1) for _ in range(dist.get_world_size())]
dist.all_gather(gathered, checksum)
if dp_rank == 0:
    print("parameter checksums per rank:", [round(t.item(), 4) for t in gathered])
dist.destroy_process_group()
