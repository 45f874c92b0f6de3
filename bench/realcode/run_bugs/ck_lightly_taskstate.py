# Source: https://github.com/lightly-ai/lightly-train/pull/301
# Original: lightly-ai/lightly-train src/lightly_train/_commands/train_task.py (TrainTaskState, the checkpoint save)
# Bug: the train task's state written to each checkpoint holds the model, the optimizer and the step, but not the
# LR scheduler, so a resumed run restarts the warm-up (the scheduler's last_epoch is -1 again); the PR adds the
# scheduler to the saved state.
import os
import tempfile

import torch
import torch.nn.functional as F

torch.manual_seed(0)


def two_stage_warmup_poly(optimizer, warmup_steps, total_steps):
    def factor(step):
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        return (1 - (step - warmup_steps) / max(1, total_steps - warmup_steps)) ** 0.9
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def save_checkpoint(path, state):
    torch.save(  # BUG
        {"train_model": state["train_model"].state_dict(), "optimizer": state["optimizer"].state_dict(),
         "step": state["step"]},
        path,
    )


def train_task(out_dir, total_steps=60, save_every=20):
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 5))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = two_stage_warmup_poly(optimizer, warmup_steps=20, total_steps=total_steps)
    state = {"train_model": model, "optimizer": optimizer, "scheduler": scheduler, "step": 0}
    for step in range(total_steps):
        x, y = torch.randn(16, 32), torch.randint(0, 5, (16,))
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        state["step"] = step + 1
        if (step + 1) % save_every == 0:
            save_checkpoint(os.path.join(out_dir, "last.ckpt"), state)
            print(f"step {step + 1} lr {scheduler.get_last_lr()[0]:.2e} loss {loss.item():.4f}")


train_task(tempfile.mkdtemp())
