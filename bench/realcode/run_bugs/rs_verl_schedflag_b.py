# Source: https://github.com/verl-project/verl/issues/7953 ("[megatron, ckpt] LR scheduler state is saved but not
#   restored on resume by default"; fix proposed in verl-project/verl#7954)
# Original: verl-project/verl verl/utils/checkpoint/megatron_checkpoint_manager.py (MegatronCheckpointManager:
#   _build_optimizer_state_dict saves `lr_scheduler` with no flag; load_checkpoint restores it only under
#   `if self.use_checkpoint_opt_param_scheduler:`, a flag that defaults to False)
# Bug: the manager writes the scheduler's state next to the optimizer's at every save, but its load restores the
# scheduler only behind a flag meant for "let the checkpoint's scheduler hyper-parameters override the config", off by
# default: a resume brings back the weights, the optimizer and the global step, and the warm-up + cosine schedule
# counts again from step 0.
import math
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F

ckpt_root = sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp()


class CheckpointManager:
    def __init__(self, model, optimizer, lr_scheduler, checkpoint_config):
        self.model = model
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.should_load_model = "model" in checkpoint_config["load_contents"]
        self.should_load_optimizer = "optimizer" in checkpoint_config["load_contents"]
        self.use_checkpoint_opt_param_scheduler = checkpoint_config.get("use_checkpoint_opt_param_scheduler", False)

    def _build_optimizer_state_dict(self):
        state_dict = {"optimizer": self.optimizer.state_dict()}
        if self.lr_scheduler is not None:
            state_dict["lr_scheduler"] = self.lr_scheduler.state_dict()
        return state_dict

    def save_checkpoint(self, local_path, global_step):
        os.makedirs(local_path, exist_ok=True)
        torch.save(self.model.state_dict(), os.path.join(local_path, "model.pt"))
        torch.save(self._build_optimizer_state_dict(), os.path.join(local_path, "optim.pt"))
        torch.save({"global_step": global_step}, os.path.join(local_path, "extra_state.pt"))

    def load_checkpoint(self, local_path):
        if self.should_load_model:
            self.model.load_state_dict(torch.load(os.path.join(local_path, "model.pt")))
        if self.should_load_optimizer:
            loaded_optim = torch.load(os.path.join(local_path, "optim.pt"))
            self.optimizer.load_state_dict(loaded_optim["optimizer"])
            if self.use_checkpoint_opt_param_scheduler:  # BUG
                assert "lr_scheduler" in loaded_optim, "checkpoint has no lr_scheduler state"
                if self.lr_scheduler is not None:
                    self.lr_scheduler.load_state_dict(loaded_optim["lr_scheduler"])
        return torch.load(os.path.join(local_path, "extra_state.pt"))["global_step"]


def warmup_cosine(warmup, total):
    def f(step):
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))
    return f


class ActorWorker:
    def __init__(self, config, seed):
        torch.manual_seed(seed)
        self.config = config
        self.actor = nn.Sequential(nn.Linear(24, 64), nn.Tanh(), nn.Linear(64, 24))
        self.actor_optimizer = torch.optim.AdamW(self.actor.parameters(), lr=config["lr"], weight_decay=0.01)
        self.actor_lr_scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.actor_optimizer, warmup_cosine(config["warmup"], config["total_steps"]))
        self.checkpoint_manager = CheckpointManager(self.actor, self.actor_optimizer, self.actor_lr_scheduler,
                                                    config["checkpoint"])
        self.g = torch.Generator().manual_seed(seed)

    def update_actor(self):
        self.actor.train()
        x = torch.randn(16, 24, generator=self.g)
        loss = F.mse_loss(self.actor(x), x.roll(1, dims=-1))
        self.actor_optimizer.zero_grad()
        loss.backward()
        self.actor_optimizer.step()
        self.actor_lr_scheduler.step()
        return self.actor_optimizer.param_groups[0]["lr"]


def fit(worker, start, stop, lrs):
    for global_step in range(start, stop):
        lrs.append(worker.update_actor())
        if (global_step + 1) % worker.config["save_freq"] == 0:
            worker.checkpoint_manager.save_checkpoint(
                os.path.join(ckpt_root, f"global_step_{global_step + 1}", "actor"), global_step + 1)


config = {"lr": 1e-3, "warmup": 10, "total_steps": 60, "save_freq": 10,
          "checkpoint": {"load_contents": ["model", "optimizer", "extra"]}}
if len(sys.argv) > 1 and sys.argv[1] == "--first-job":
    fit(ActorWorker(config, 1), 0, 30, [])
    sys.exit(0)

subprocess.run([sys.executable, __file__, "--first-job", ckpt_root], check=True,
               env={k: v for k, v in os.environ.items() if not k.startswith("TORCHDOCTOR")})
worker = ActorWorker(config, 0)
start = worker.checkpoint_manager.load_checkpoint(os.path.join(ckpt_root, "global_step_30", "actor"))
lrs = []
fit(worker, start, start + 30, lrs)
print(f"resumed at global step {start}: LR {lrs[0]:.2e} at step {start + 1} (the schedule gives "
      f"{1e-3 * warmup_cosine(10, 60)(start):.2e} there), scheduler count {worker.actor_lr_scheduler.last_epoch}")
