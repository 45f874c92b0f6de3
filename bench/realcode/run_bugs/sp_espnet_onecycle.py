# Source: https://github.com/espnet/espnet/pull/3319
# Original: espnet/espnet espnet2/train/trainer.py (Trainer.run / train_one_epoch) and espnet2/schedulers
# Bug: OneCycleLR was registered as an epoch-level scheduler (#3303), so the trainer stepped it once per
# epoch while its total_steps counts iterations: the run ends still inside the warm-up, at a small fraction
# of max_lr. The fix steps OneCycleLR and CyclicLR per iteration.
import torch
import torch.nn.functional as F

torch.manual_seed(0)
EPOCH_SCHEDULERS = (torch.optim.lr_scheduler.StepLR, torch.optim.lr_scheduler.OneCycleLR)


def train_one_epoch(model, iterator, optimizer, scheduler):
    model.train()
    for speech, text in iterator:
        loss = F.cross_entropy(model(speech), text)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if scheduler is not None and not isinstance(scheduler, EPOCH_SCHEDULERS):
            scheduler.step()


def run(model, optimizer, scheduler, iterator, max_epoch):
    for iepoch in range(1, max_epoch + 1):
        train_one_epoch(model, iterator, optimizer, scheduler)
        if isinstance(scheduler, EPOCH_SCHEDULERS):
            scheduler.step()  # BUG
        print("epoch", iepoch, "lr", optimizer.param_groups[0]["lr"])


model = torch.nn.Sequential(torch.nn.Linear(40, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
max_epoch = 5
iterator = [(torch.randn(8, 40), torch.randint(0, 10, (8,))) for _ in range(16)]
scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1e-3, total_steps=max_epoch * len(iterator))
run(model, optimizer, scheduler, iterator, max_epoch)
print("done")
