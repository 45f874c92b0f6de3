# Source: https://github.com/milesial/Pytorch-UNet/pull/470
# Original: milesial/Pytorch-UNet train.py (train_model)
# Bug: clip_grad_norm_ runs on the GradScaler-scaled gradients (no grad_scaler.unscale_ before it), so the
# clipping threshold is in effect divided by the loss scale.
import torch
import torch.nn.functional as F

torch.manual_seed(0)
device_type = "cpu"
amp, gradient_clipping = True, 1.0
model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                            torch.nn.Conv2d(8, 2, 1))
optimizer = torch.optim.RMSprop(model.parameters(), lr=1e-5, weight_decay=1e-8, momentum=0.999, foreach=True)
grad_scaler = torch.amp.GradScaler(device_type, enabled=amp)
for epoch in range(1, 3):
    model.train()
    for _ in range(15):
        images, true_masks = torch.randn(2, 3, 16, 16), torch.randint(0, 2, (2, 16, 16))
        with torch.autocast(device_type, dtype=torch.float16, enabled=amp):
            masks_pred = model(images)
            loss = F.cross_entropy(masks_pred.float(), true_masks)
        optimizer.zero_grad(set_to_none=True)
        grad_scaler.scale(loss).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), gradient_clipping)  # BUG
        grad_scaler.step(optimizer)
        grad_scaler.update()
print("done")
