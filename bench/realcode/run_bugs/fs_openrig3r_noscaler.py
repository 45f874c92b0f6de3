# Source: https://github.com/engichang1467/Open-Rig3R/issues/35
# Original: engichang1467/Open-Rig3R scripts/train.py
# Bug: the training forward runs under torch.amp.autocast with no dtype on a GPU (float16) and there is no
# GradScaler anywhere: small float16 gradients underflow to zero silently.
import torch
import torch.nn.functional as F

torch.manual_seed(0)
device_type = "cuda" if torch.cuda.is_available() else "cpu"
model = torch.nn.Sequential(torch.nn.Linear(24, 64), torch.nn.GELU(), torch.nn.Linear(64, 3))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

for epoch in range(2):
    for it in range(20):
        images, pts = torch.randn(8, 24), torch.randn(8, 3)
        optimizer.zero_grad()
        with torch.amp.autocast(device_type=device_type, dtype=torch.float16):
            pred = model(images)
            loss = F.smooth_l1_loss(pred.float(), pts)
        loss.backward()  # BUG
        optimizer.step()
print("done")
