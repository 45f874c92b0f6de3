# Source: https://github.com/EvolvingLMMs-Lab/OneVision-Encoder/pull/65
# Original: EvolvingLMMs-Lab/OneVision-Encoder training/checkpoint_utils.py (save_checkpoint) and training/train.py
# Bug: the checkpoint helper writes the backbone weights and the LR scheduler's state but never the AdamW
# optimizer's (exp_avg, exp_avg_sq, step), so a resumed run restarts Adam's moments: loss spikes after resume.
import os
import tempfile

import torch
import torch.nn.functional as F

torch.manual_seed(0)


def save_checkpoint(output_dir, backbone, lr_scheduler, global_step):
    ckpt_dir = os.path.join(output_dir, f"checkpoint_{global_step:06d}")
    os.makedirs(ckpt_dir, exist_ok=True)
    torch.save(backbone.state_dict(), os.path.join(ckpt_dir, "backbone.pt"))  # BUG
    torch.save(lr_scheduler.state_dict(), os.path.join(ckpt_dir, "scheduler.pt"))
    return ckpt_dir


class Backbone(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.patch = torch.nn.Linear(48, 64)
        self.blocks = torch.nn.Sequential(torch.nn.LayerNorm(64), torch.nn.Linear(64, 64), torch.nn.GELU())
        self.head = torch.nn.Linear(64, 10)

    def forward(self, x):
        return self.head(self.blocks(self.patch(x)).mean(1))


backbone = Backbone()
optimizer = torch.optim.AdamW(backbone.parameters(), lr=1e-3, weight_decay=0.05)
lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 20))
output_dir = tempfile.mkdtemp()
g = torch.Generator().manual_seed(3)
for global_step in range(1, 81):
    x, y = torch.randn(8, 16, 48, generator=g), torch.randint(0, 10, (8,), generator=g)
    loss = F.cross_entropy(backbone(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    lr_scheduler.step()
    if global_step % 20 == 0:
        save_checkpoint(output_dir, backbone, lr_scheduler, global_step)
print("saved", sorted(os.listdir(output_dir)))
