# Source: https://github.com/moojink/openvla-oft/issues/160
# Original: moojink/openvla-oft vla-scripts/finetune.py (wrap_ddp, init_module, run_forward_pass, the training loop in
# finetune), read at 213c5ff
# Bug: finetune wraps both the VLA and the L1-regression action head in DistributedDataParallel, but run_forward_pass
# predicts the actions with action_head.module.predict_action(...): the action head's DDP forward never runs, its
# reducer is never prepared, and backward all-reduces the VLA's gradients but not the action head's. Each rank
# updates its own action head on its own shard and the heads drift apart (the issue is open, no maintainer answer).
# Ours: a small MLP "VLA" that returns hidden states instead of the Prismatic VLM (no LoRA, no tokenizer, no FiLM or
# proprio), a two-layer action head instead of MLPResNet, random batches per rank, AdamW, 12 steps; run with
# torchrun --nproc-per-node 2 (gloo, CPU).

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

NUM_ACTIONS_CHUNK = 8
ACTION_DIM = 7


def wrap_ddp(module: nn.Module, device_id, find_unused: bool = False) -> DDP:
    return DDP(module, device_ids=device_id, find_unused_parameters=find_unused, gradient_as_bucket_view=True)


def init_module(module_class, module_name, device_id, module_args, find_unused_params=False) -> DDP:
    module = module_class(**module_args)
    return wrap_ddp(module, device_id, find_unused_params)


class TinyVLA(nn.Module):
    """Stand-in for OpenVLAForActionPrediction: returns the last hidden states of the action tokens."""

    def __init__(self, llm_dim=32):
        super().__init__()
        self.llm_dim = llm_dim
        self.backbone = nn.Sequential(nn.Linear(16, llm_dim), nn.GELU(), nn.Linear(llm_dim, llm_dim))

    def forward(self, input_ids):
        return self.backbone(input_ids)


class L1RegressionActionHead(nn.Module):
    def __init__(self, input_dim=32, hidden_dim=32, action_dim=ACTION_DIM):
        super().__init__()
        self.action_dim = action_dim
        self.model = nn.Sequential(nn.LayerNorm(input_dim * ACTION_DIM), nn.Linear(input_dim * ACTION_DIM, hidden_dim),
                                   nn.ReLU(), nn.Linear(hidden_dim, action_dim))

    def predict_action(self, actions_hidden_states):
        batch_size = actions_hidden_states.shape[0]
        rearranged_actions_hidden_states = actions_hidden_states.reshape(batch_size, NUM_ACTIONS_CHUNK, -1)
        action = self.model(rearranged_actions_hidden_states)
        return action


def run_forward_pass(vla, action_head, batch):
    ground_truth_actions = batch["actions"]
    actions_hidden_states = vla(batch["input_ids"])  # (B, act_chunk_len * ACTION_DIM, D)
    predicted_actions = action_head.module.predict_action(actions_hidden_states)  # BUG
    loss = torch.nn.L1Loss()(ground_truth_actions, predicted_actions)
    return loss, {"loss_value": loss.item()}


def finetune(rank, world_size, max_steps=12, grad_accumulation_steps=1):
    torch.manual_seed(0)
    vla = wrap_ddp(TinyVLA(), None, find_unused=True)
    action_head = init_module(L1RegressionActionHead, "action_head", None,
                              {"input_dim": vla.module.llm_dim, "hidden_dim": vla.module.llm_dim,
                               "action_dim": ACTION_DIM})
    trainable_params = [param for param in vla.parameters() if param.requires_grad]
    trainable_params += [param for param in action_head.parameters() if param.requires_grad]
    optimizer = torch.optim.AdamW(trainable_params, lr=1e-3)

    generator = torch.Generator().manual_seed(100 + rank)  # each rank its own shard
    vla.train()
    optimizer.zero_grad()
    for batch_idx in range(max_steps):
        batch = {"input_ids": torch.randn(4, NUM_ACTIONS_CHUNK * ACTION_DIM, 16, generator=generator),
                 "actions": torch.randn(4, NUM_ACTIONS_CHUNK, ACTION_DIM, generator=generator)}
        loss, metrics = run_forward_pass(vla=vla, action_head=action_head, batch=batch)
        normalized_loss = loss / grad_accumulation_steps
        normalized_loss.backward()
        if (batch_idx + 1) % grad_accumulation_steps == 0:
            optimizer.step()
            optimizer.zero_grad()
    if rank == 0:
        print("final loss", metrics["loss_value"])
    return vla, action_head


def main():
    rank, world_size = dist.get_rank(), dist.get_world_size()
    finetune(rank, world_size)


if __name__ == "__main__":
    dist.init_process_group("gloo")
    main()
    dist.barrier()
    dist.destroy_process_group()
