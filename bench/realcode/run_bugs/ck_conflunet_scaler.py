# Source: https://github.com/maxencewynen/ConfLUNet/pull/16
# Original: maxencewynen/ConfLUNet conflunet/training/trainer.py (save_checkpoint)
# Bug: the checkpoint saves model, optimizer and scheduler but not the GradScaler state, and resume never
# restores it, so a resumed fp16 run restarts the loss scale from 65536.
import os
import tempfile

import torch
import torch.nn.functional as F

torch.manual_seed(0)
device = "cpu"
model = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 2, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.99, nesterov=True)
lr_scheduler = torch.optim.lr_scheduler.PolynomialLR(optimizer, total_iters=4, power=0.9)  # stepped once per epoch
grad_scaler = torch.amp.GradScaler(device)
output_folder = tempfile.mkdtemp()


def save_checkpoint(filename, current_epoch):
    checkpoint = {
        "network_weights": model.state_dict(),
        "optimizer_state": optimizer.state_dict(),
        "lr_scheduler": lr_scheduler.state_dict(),
        "current_epoch": current_epoch + 1,
    }
    torch.save(checkpoint, filename)  # BUG


for epoch in range(4):
    for it in range(10):
        data, target = torch.randn(2, 1, 16, 16), torch.randint(0, 2, (2, 16, 16))
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=torch.float16):
            output = model(data)
            loss = F.cross_entropy(output.float(), target)
        grad_scaler.scale(loss).backward()
        grad_scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 12)
        grad_scaler.step(optimizer)
        grad_scaler.update()
    lr_scheduler.step()
    save_checkpoint(os.path.join(output_folder, "checkpoint_latest.pth"), epoch)
print("done")
