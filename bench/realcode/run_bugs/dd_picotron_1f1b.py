# Source: https://github.com/huggingface/picotron/pull/5
# Original: huggingface/picotron src/parallel/pipeline_parallel.py (train_step_pipeline_1f1b), at 2bafa31
# Bug: the 1F1B schedule turns gradient sync off before its steady-state loop and turns it back on only in the
# cooldown loop; the last pipeline stage has no warmup microbatches, so its cooldown loop never runs and its
# data-parallel replicas never all-reduce (the PR's "rank 1 never synchronizes"). Ours runs one pipeline stage, which
# is that last stage, on two data-parallel ranks.
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
dp_rank = dist.get_rank()
pp_world_size, pp_rank = 1, 0
torch.manual_seed(0)


class TinyDecoder(nn.Module):
    def __init__(self, vocab=64, dim=48, layers=2):
        super().__init__()
        self.embedding = nn.Embedding(vocab, dim)
        self.decoder_layers = nn.ModuleList(
            [nn.TransformerEncoderLayer(dim, 4, 96, dropout=0.0, batch_first=True) for _ in range(layers)])
        self.final_norm = nn.LayerNorm(dim)
        self.final_proj = nn.Linear(dim, vocab)

    def forward(self, input_ids):
        x = self.embedding(input_ids)
        mask = nn.Transformer.generate_square_subsequent_mask(input_ids.shape[1])
        for layer in self.decoder_layers:
            x = layer(x, src_mask=mask, is_causal=True)
        return self.final_proj(self.final_norm(x))


def backward(input_tensor, output_tensor, output_tensor_grad):
    if output_tensor_grad is None:
        output_tensor_grad = torch.ones_like(output_tensor, memory_format=torch.preserve_format)
    torch.autograd.backward(output_tensor, grad_tensors=output_tensor_grad, retain_graph=False, create_graph=False)
    return None


def micro_batches(seed):
    g = torch.Generator().manual_seed(seed)
    while True:
        start = torch.randint(0, 64, (4, 1), generator=g)
        seq = (start + torch.arange(17)) % 64  # counting sequences, shards differ per rank
        yield {"input_ids": seq[:, :-1], "target_ids": seq[:, 1:]}


def train_step_pipeline_1f1b(model, data_loader, grad_acc_steps):
    num_warmup_microbatches = min(pp_world_size - pp_rank - 1, grad_acc_steps)
    num_microbatches_remaining = grad_acc_steps - num_warmup_microbatches
    logging_loss, input_tensors, output_tensors = 0.0, [], []
    requires_grad_sync = dist.get_world_size() > 1  # we disable gradient synchronization for 1F1B, except for the last microbatch

    def _forward_step(input_tensor):
        nonlocal logging_loss
        batch = next(data_loader)
        output_tensor = model(batch["input_ids"])
        output_tensor = F.cross_entropy(output_tensor.transpose(1, 2), batch["target_ids"], reduction="mean")
        logging_loss += output_tensor.item() / grad_acc_steps
        return output_tensor

    for _ in range(num_warmup_microbatches):  # Warmup forward passes
        output_tensor = _forward_step(None)
        input_tensors.append(None)
        output_tensors.append(output_tensor)

    input_tensor = None
    for _ in range(num_microbatches_remaining):  # 1F1B steady state
        if requires_grad_sync:
            model.require_backward_grad_sync = False  # BUG
        output_tensor = _forward_step(input_tensor)
        input_tensors.append(input_tensor)
        output_tensors.append(output_tensor)
        input_tensor, output_tensor = input_tensors.pop(0), output_tensors.pop(0)
        backward(input_tensor, output_tensor, None)

    for i in range(num_warmup_microbatches):  # Cooldown backward passes
        if requires_grad_sync:
            model.require_backward_grad_sync = (i == num_warmup_microbatches - 1)  # we synchronize at the last microbatch
        input_tensor, output_tensor = input_tensors.pop(0), output_tensors.pop(0)
        backward(input_tensor, output_tensor, None)
    return logging_loss


model = DDP(TinyDecoder())
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
data_loader = micro_batches(seed=100 + dp_rank)
for step in range(1, 21):
    optimizer.zero_grad()
    loss = train_step_pipeline_1f1b(model, data_loader, grad_acc_steps=4)
    optimizer.step()
    if step % 10 == 0:
        print(f"[dp {dp_rank}] step {step} loss {loss:.4f}")
dist.barrier()
dist.destroy_process_group()
