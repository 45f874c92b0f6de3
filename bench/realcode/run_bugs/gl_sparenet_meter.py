# Source: https://github.com/microsoft/SpareNet/issues/12
# Original: microsoft/SpareNet runners/sparenet_runner.py (the losses' meter updates) and utils/average_meter.py
# Bug: the runner hands the loss tensors themselves to the AverageMeters kept for visualisation; each meter
# sums them into an attribute, so every iteration's graph stays alive and memory climbs until OOM after ~2 epochs.
import torch
import torch.nn.functional as F

torch.manual_seed(0)


class AverageMeter:
    def __init__(self):
        self.reset()

    def reset(self):
        self.val, self.sum, self.count = 0, 0, 0

    def update(self, val, n=1):
        self.val = val
        self.sum += val * n
        self.count += n

    def avg(self):
        return self.sum / self.count


class Runner:
    def __init__(self, model):
        self.model = model
        self.optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
        self.losses = {"coarse": AverageMeter(), "refine": AverageMeter()}

    def train_step(self, partial, gt):
        coarse = self.model(partial)
        refine = coarse + 0.1 * torch.tanh(coarse)
        coarse_loss = F.mse_loss(coarse, gt)
        refine_loss = F.l1_loss(refine, gt)
        self.optimizer.zero_grad()
        (coarse_loss + refine_loss).backward()
        self.optimizer.step()
        self.losses["coarse"].update(coarse_loss)  # BUG
        self.losses["refine"].update(refine_loss)


model = torch.nn.Sequential(torch.nn.Linear(3 * 128, 512), torch.nn.ReLU(), torch.nn.Linear(512, 3 * 256))
runner = Runner(model)
for epoch in range(2):
    for meter in runner.losses.values():
        meter.reset()
    for i in range(40):
        runner.train_step(torch.randn(8, 3 * 128), torch.randn(8, 3 * 256))
    print(epoch, {k: round(float(m.avg()), 4) for k, m in runner.losses.items()})
