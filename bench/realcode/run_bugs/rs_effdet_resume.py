# Source: https://github.com/zylo117/Yet-Another-EfficientDet-Pytorch/issues/269
# Original: zylo117/Yet-Another-EfficientDet-Pytorch train.py (--load_weights)
# Bug: resuming from a saved .pth restores the weights only; the AdamW optimizer starts with empty state
# (the maintainer: "I'm lazy and loading optimizer state_dict or not doesn't seem to have a big difference").
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F

torch.manual_seed(0)
saved_path = tempfile.mkdtemp()
weights_path = os.path.join(saved_path, "efficientdet-d0_10_2000.pth")
subprocess.run([sys.executable, "-c", (
    "import torch\n"
    "m = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 9, 1))\n"
    f"torch.save(m.state_dict(), {weights_path!r})\n")],
    check=True, env={k: v for k, v in os.environ.items() if not k.startswith("TORCHDOCTOR")})

model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 9, 1))
last_step = int(os.path.basename(weights_path).split("_")[-1].split(".")[0])
ret = model.load_state_dict(torch.load(weights_path), strict=False)  # BUG
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=3)
step = max(0, last_step)
for epoch in range(3):
    for it in range(10):
        imgs, annot = torch.randn(2, 3, 16, 16), torch.rand(2, 9, 16, 16)
        optimizer.zero_grad()
        loss = F.mse_loss(model(imgs), annot)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
        optimizer.step()
        step += 1
    scheduler.step(loss.item())
print("done")
