# Source: https://github.com/OpenRLHF/OpenRLHF/pull/583
# Original: OpenRLHF/OpenRLHF openrlhf/models/loss.py (GPTLMLoss.forward, the RingAttention branch)
# Bug: with ring attention each rank takes the loss over its own slice of the sequence; a rank whose slice
# holds only prompt tokens has labels that are all IGNORE_INDEX, nn.CrossEntropyLoss(mean) over zero
# targets is 0/0 = nan, and the all_reduce hands that nan to every rank of the ring group.
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
vocab, seq_len, prompt_len = 64, 16, 9


class GPTLMLoss(nn.Module):
    def __init__(self, ring_attn_group=None):
        super().__init__()
        self.IGNORE_INDEX = -100
        self.loss = nn.CrossEntropyLoss(ignore_index=self.IGNORE_INDEX)
        self.ring_attn_group = ring_attn_group
        if self.ring_attn_group:
            self.ring_attn_rank = dist.get_rank(self.ring_attn_group)
            self.ring_attn_world_size = dist.get_world_size(self.ring_attn_group)

    def forward(self, logits, labels):
        if self.ring_attn_group is not None:
            total_seq_len = labels.size(-1)
            seq_len_per_process = total_seq_len // self.ring_attn_world_size
            start_idx = self.ring_attn_rank * seq_len_per_process
            end_idx = min(start_idx + seq_len_per_process, total_seq_len)
            labels = labels[..., start_idx:end_idx]
            shift_logits = logits[..., :-1, :].contiguous()
            shift_labels = labels[..., 1:].contiguous()
            loss = self.loss(shift_logits.view(-1, shift_logits.size(-1)), shift_labels.view(-1))  # BUG
            dist.all_reduce(loss, op=dist.ReduceOp.SUM, group=self.ring_attn_group)
            loss = loss / self.ring_attn_world_size
        else:
            shift_logits = logits[..., :-1, :].contiguous()
            shift_labels = labels[..., 1:].contiguous()
            loss = self.loss(shift_logits.view(-1, shift_logits.size(-1)), shift_labels.view(-1))
        return loss


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(vocab, 32)
        self.mix = nn.GRU(32, 32, batch_first=True)
        self.head = nn.Linear(32, vocab)

    def forward(self, input_ids):
        return self.head(self.mix(self.embed(input_ids))[0])


ring_group = dist.new_group([0, 1])
model = DDP(TinyLM())
loss_fn = GPTLMLoss(ring_attn_group=ring_group)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(7)  # the same SFT batch on both ranks of the ring group
for step in range(20):
    input_ids = torch.randint(0, vocab, (4, seq_len), generator=g)
    labels = input_ids.clone()
    labels[:, :prompt_len] = -100  # the prompt is not trained on; here it fills the first rank's slice
    per_rank = seq_len // 2
    local_ids = input_ids[:, rank * per_rank:(rank + 1) * per_rank]  # ring attention: each rank its slice
    loss = loss_fn(model(local_ids), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if rank == 0 and step % 5 == 0:
        print(f"step {step} loss {loss.item():.4f}")
dist.destroy_process_group()
