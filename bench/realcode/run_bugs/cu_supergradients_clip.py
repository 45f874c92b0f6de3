# Source: https://github.com/Deci-AI/super-gradients/pull/653
# Original: Deci-AI/super-gradients src/super_gradients/training/sg_trainer/sg_trainer.py (_backward_step)
# Bug: gradient clipping runs right after self.scaler.scale(loss).backward(), with no unscale_, on every
# micro-batch: the scaled gradients are clipped.
import torch
import torch.nn.functional as F

torch.manual_seed(0)


class Trainer:
    def __init__(self, net, batch_accumulate=1, clip_grad_norm=10.0):
        self.net = net
        self.optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
        self.scaler = torch.amp.GradScaler("cpu")
        self.batch_accumulate = batch_accumulate
        self.training_params = {"clip_grad_norm": clip_grad_norm}

    def _backward_step(self, loss, epoch, batch_idx):
        self.scaler.scale(loss).backward()
        if self.training_params["clip_grad_norm"]:
            torch.nn.utils.clip_grad_norm_(self.net.parameters(), self.training_params["clip_grad_norm"])  # BUG
        if (batch_idx + 1) % self.batch_accumulate == 0:
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self.optimizer.zero_grad()

    def _train_epoch(self, epoch, loader):
        self.net.train()
        for batch_idx, (inputs, targets) in enumerate(loader):
            with torch.autocast("cpu", dtype=torch.float16):
                outputs = self.net(inputs)
                loss = F.cross_entropy(outputs.float(), targets)
            self._backward_step(loss, epoch, batch_idx)


net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 10))
loader = [(torch.randn(8, 3, 8, 8), torch.randint(0, 10, (8,))) for _ in range(15)]
trainer = Trainer(net)
for epoch in range(2):
    trainer._train_epoch(epoch, loader)
print("done")
