# Source: https://github.com/NVIDIA/Megatron-LM/issues/1403
# Original: NVIDIA/Megatron-LM megatron/core/pipeline_parallel/schedules.py (forward_backward_no_pipelining,
# forward_step) and the pretrain_gpt-style loss_func / train_step that call it
# Bug: the schedule adds each micro-batch's token count to the running total with num_tokens.item(), a
# device-to-host copy between every forward and backward that makes the host wait for the device; the fix
# keeps the total as a device tensor (total_num_tokens += num_tokens).
import contextlib
from functools import partial

import torch
import torch.nn.functional as F

torch.manual_seed(0)


class TinyGPT(torch.nn.Module):
    def __init__(self, vocab=128, dim=64):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim))
        self.out = torch.nn.Linear(dim, vocab)

    def forward(self, tokens, labels):
        h = self.embed(tokens)
        logits = self.out(h + self.mlp(h))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.reshape(-1), reduction="none").view_as(labels)


def loss_func(loss_mask, output_tensor):
    losses = output_tensor.float()
    loss_mask = loss_mask.view(-1).float()
    loss = torch.sum(losses.view(-1) * loss_mask)
    num_tokens = loss_mask.sum().clone().detach().to(torch.int)
    return loss, num_tokens, {"lm loss": torch.stack([loss.detach(), num_tokens.float()])}


def forward_step_func(data_iterator, model):
    tokens, labels, loss_mask = next(data_iterator)
    return model(tokens, labels), partial(loss_func, loss_mask)


def forward_step(forward_step_func, data_iterator, model, forward_data_store):
    output_tensor, loss_func = forward_step_func(data_iterator, model)
    output_tensor, num_tokens, loss_reduced = loss_func(output_tensor)
    forward_data_store.append(loss_reduced)
    return output_tensor, num_tokens


def backward_step(output_tensor, grad_scale=1.0):
    torch.autograd.backward(output_tensor * grad_scale)


def forward_backward_no_pipelining(*, forward_step_func, data_iterator, model, num_microbatches, no_sync_func=None):
    no_sync_func = no_sync_func or contextlib.nullcontext
    forward_data_store = []
    total_num_tokens = torch.zeros([], dtype=torch.int)
    with no_sync_func():
        for i in range(num_microbatches - 1):
            output_tensor, num_tokens = forward_step(forward_step_func, data_iterator, model, forward_data_store)
            total_num_tokens += num_tokens.item()  # BUG
            backward_step(output_tensor)
    output_tensor, num_tokens = forward_step(forward_step_func, data_iterator, model, forward_data_store)
    total_num_tokens += num_tokens.item()
    backward_step(output_tensor)
    return forward_data_store, total_num_tokens


def finalize_model_grads(model, num_tokens):
    for p in model.parameters():
        if p.grad is not None:
            p.grad.div_(num_tokens.clamp_min(1))


def train_step(data_iterator, model, optimizer, num_microbatches):
    optimizer.zero_grad()
    losses_reduced, total_num_tokens = forward_backward_no_pipelining(
        forward_step_func=forward_step_func, data_iterator=data_iterator, model=model,
        num_microbatches=num_microbatches)
    finalize_model_grads(model, total_num_tokens)
    optimizer.step()
    summed = torch.stack([x["lm loss"] for x in losses_reduced]).sum(0)
    return summed[0] / summed[1]


def batches(micro_batch_size=4, seq_length=32):
    while True:
        tokens = torch.randint(0, 128, (micro_batch_size, seq_length + 1))
        loss_mask = (torch.rand(micro_batch_size, seq_length) > 0.1).float()
        yield tokens[:, :-1], tokens[:, 1:], loss_mask


model = TinyGPT()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
data_iterator = batches()
for iteration in range(80):
    lm_loss = train_step(data_iterator, model, optimizer, num_microbatches=4)
    if iteration % 40 == 0:
        print("iteration", iteration, "lm loss", round(lm_loss.item(), 4))
