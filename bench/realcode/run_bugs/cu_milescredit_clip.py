# Source: https://github.com/NCAR/miles-credit/pull/141
# Original: NCAR/miles-credit credit/trainers/trainerERA5_v2.py (Trainer.train_one_epoch)
# Bug: clip_grad_norm_ runs after scaler.scale(loss).backward() with no scaler.unscale_(optimizer), so the
# scaled gradients are clipped.
import torch
import torch.nn.functional as F

torch.manual_seed(0)
conf = {"trainer": {"grad_accum_every": 2, "grad_max_norm": 1.0, "amp": True}}
model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.GELU(), torch.nn.Linear(64, 20))
optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4)
scaler = torch.amp.GradScaler("cpu", enabled=conf["trainer"]["amp"])
grad_accum_every = conf["trainer"]["grad_accum_every"]
for i in range(30):
    logs = {}
    for _ in range(grad_accum_every):
        x, y = torch.randn(8, 20), torch.randn(8, 20)
        with torch.autocast("cpu", dtype=torch.float16, enabled=conf["trainer"]["amp"]):
            y_pred = model(x)
            loss = F.mse_loss(y_pred.float(), y)
        scaler.scale(loss / grad_accum_every).backward()
    if conf["trainer"]["grad_max_norm"] > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=conf["trainer"]["grad_max_norm"])  # BUG
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
print("done")
