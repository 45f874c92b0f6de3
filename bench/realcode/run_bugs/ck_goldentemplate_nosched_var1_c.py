# Source: https://github.com/amjltc295/pytorch-golden-template/issues/50 (variant of ck_goldentemplate_nosched_b: a
#   checkpoint that leaves out training state the run keeps stepping, here in an accelerate loop; the code is ours)
# Bug: every `checkpointing_steps` the loop writes the unwrapped model's weights alone (accelerator.save of the
# state_dict) while AdamW and a linear warm-up schedule train it; the script's --resume_from_checkpoint path loads
# those weights back, so a continued run restarts the optimizer's moments and the warm-up.
import argparse
import os
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from transformers import get_linear_schedule_with_warmup

parser = argparse.ArgumentParser()
parser.add_argument("--output_dir", default=tempfile.mkdtemp())
parser.add_argument("--checkpointing_steps", type=int, default=8)
parser.add_argument("--max_train_steps", type=int, default=40)
parser.add_argument("--resume_from_checkpoint", default=None)
args = parser.parse_args()

accelerator = Accelerator(cpu=True)
torch.manual_seed(0)
model = nn.Sequential(nn.Embedding(50, 32), nn.Flatten(), nn.Linear(32 * 6, 50))
optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4)
lr_scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=10, num_training_steps=args.max_train_steps)
if args.resume_from_checkpoint:
    model.load_state_dict(torch.load(args.resume_from_checkpoint, map_location="cpu"))
model, optimizer, lr_scheduler = accelerator.prepare(model, optimizer, lr_scheduler)

g = torch.Generator().manual_seed(0)
completed_steps = 0
model.train()
while completed_steps < args.max_train_steps:
    tokens = torch.randint(0, 50, (16, 7), generator=g)
    loss = F.cross_entropy(model(tokens[:, :6]), tokens[:, 6])
    accelerator.backward(loss)
    optimizer.step()
    lr_scheduler.step()
    optimizer.zero_grad()
    completed_steps += 1
    if completed_steps % args.checkpointing_steps == 0:
        output_dir = os.path.join(args.output_dir, f"step_{completed_steps}")
        os.makedirs(output_dir, exist_ok=True)
        accelerator.save(accelerator.unwrap_model(model).state_dict(), os.path.join(output_dir, "pytorch_model.bin"))  # BUG
print(f"{completed_steps // args.checkpointing_steps} checkpoints of the weights alone, written under "
      f"{args.output_dir}; LR now {lr_scheduler.get_last_lr()[0]:.1e}")
