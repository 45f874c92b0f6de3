# Source: https://github.com/starVLA/starVLA/issues/395
# Original: starVLA/starVLA starVLA/training/train_starvla.py (the trainer's native Accelerate training loop)
# Bug: optimizer.zero_grad() opens the accelerator.accumulate(model) block; Accelerate's optimizer only acts on
# the sync micro-batch, so there it clears the gradients of the earlier micro-batches right before the last
# backward: every update uses one micro-batch out of gradient_accumulation_steps (confirmed by the maintainer).
import torch
import torch.nn.functional as F
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)


class ActionModel(torch.nn.Module):
    def __init__(self, obs_dim=24, act_dim=7):
        super().__init__()
        self.backbone = torch.nn.Sequential(torch.nn.Linear(obs_dim, 128), torch.nn.GELU(), torch.nn.Linear(128, 128))
        self.action_head = torch.nn.Linear(128, act_dim)

    def forward(self, obs, actions):
        pred = self.action_head(torch.nn.functional.gelu(self.backbone(obs)))
        return {"action_loss": F.l1_loss(pred, actions)}


class VLATrainer:
    def __init__(self, model, dataloader, grad_accum=4, max_grad_norm=1.0):
        self.accelerator = Accelerator(gradient_accumulation_steps=grad_accum, cpu=True)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 10))
        self.model, self.optimizer, self.dataloader, self.lr_scheduler = self.accelerator.prepare(
            model, optimizer, dataloader, scheduler)
        self.max_grad_norm = max_grad_norm
        self.completed_steps = 0

    def _train_step(self, batch):
        obs, actions = batch
        with self.accelerator.accumulate(self.model):
            self.optimizer.zero_grad()  # BUG
            output = self.model(obs, actions)
            loss = output["action_loss"]
            self.accelerator.backward(loss)
            if self.accelerator.sync_gradients:
                self.accelerator.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
            self.optimizer.step()
            self.lr_scheduler.step()
        if self.accelerator.sync_gradients:
            self.completed_steps += 1
        return loss.item()

    def train(self, epochs):
        self.model.train()
        for epoch in range(epochs):
            losses = [self._train_step(batch) for batch in self.dataloader]
            print("epoch", epoch, "steps", self.completed_steps, "loss", round(sum(losses) / len(losses), 4))


obs = torch.randn(512, 24)
actions = torch.tanh(obs[:, :7] + 0.1 * torch.randn(512, 7))
loader = DataLoader(TensorDataset(obs, actions), batch_size=16, shuffle=True)
VLATrainer(ActionModel(), loader).train(epochs=3)
