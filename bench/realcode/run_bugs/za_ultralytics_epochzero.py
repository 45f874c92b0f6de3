# Source: https://github.com/ultralytics/ultralytics/pull/11217
# Original: ultralytics/ultralytics ultralytics/engine/trainer.py (BaseTrainer._do_train / optimizer_step)
# Bug: optimizer.zero_grad() runs at the start of every epoch as well as after each optimizer step; the
# optimizer steps only every `accumulate` batches counted across epochs, so the micro-batches accumulated
# at the end of an epoch are erased before they are ever applied.
import torch
import torch.nn.functional as F

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                            torch.nn.Flatten(), torch.nn.Linear(8, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
nbs, batch_size = 32, 8
accumulate = max(round(nbs / batch_size), 1)
train_loader = [(torch.randn(batch_size, 3, 16, 16), torch.randint(0, 4, (batch_size,))) for _ in range(10)]
nb = len(train_loader)


def optimizer_step():
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=10.0)
    optimizer.step()
    optimizer.zero_grad()


last_opt_step = -1
for epoch in range(6):
    model.train()
    optimizer.zero_grad()  # BUG
    for i, (imgs, cls) in enumerate(train_loader):
        ni = i + nb * epoch
        loss = F.cross_entropy(model(imgs), cls)
        loss.backward()
        if ni - last_opt_step >= accumulate:
            optimizer_step()
            last_opt_step = ni
print("done")
