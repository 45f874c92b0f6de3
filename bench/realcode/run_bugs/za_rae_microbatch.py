# Source: https://github.com/bytetriper/RAE/issues/67 (fix proposed in https://github.com/bytetriper/RAE/pull/78)
# Original: bytetriper/RAE src/train.py
# Bug: optimizer.zero_grad(set_to_none=True) sits inside the micro-batch loop, so gradients are cleared
# every micro-batch instead of being accumulated up to the step.
import torch
import torch.nn.functional as F

torch.manual_seed(0)
grad_accum = 4
model = torch.nn.Sequential(torch.nn.Linear(24, 48), torch.nn.GELU(), torch.nn.Linear(48, 24))
opt = torch.optim.AdamW(model.parameters(), lr=2e-4)

for step in range(25):
    batch = torch.randn(32, 24)
    for micro in batch.chunk(grad_accum):
        opt.zero_grad(set_to_none=True)  # BUG
        loss = F.mse_loss(model(micro), micro) / grad_accum
        loss.backward()
    opt.step()
print("done")
