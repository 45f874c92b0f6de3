# Source: https://github.com/tientrandinh/Revisiting-Reverse-Distillation/issues/12
# Original: tientrandinh/Revisiting-Reverse-Distillation main.py (train)
# Bug: both optimizers are zeroed before every backward although they only step every
# accumulation_steps batches: only the last micro-batch's gradients are ever applied.
import torch
import torch.nn.functional as F

torch.manual_seed(0)
accumulation_steps = 2
encoder = torch.nn.Sequential(torch.nn.Linear(32, 16), torch.nn.ReLU())
decoder = torch.nn.Sequential(torch.nn.Linear(16, 32))
proj = torch.nn.Linear(16, 16)
optimizer = torch.optim.Adam(decoder.parameters(), lr=5e-3)
optimizer_proj = torch.optim.Adam(proj.parameters(), lr=5e-3)

for epoch in range(3):
    for i in range(24):
        img = torch.randn(8, 32)
        with torch.no_grad():
            feat = encoder(img)
        out = decoder(proj(feat))
        loss = F.mse_loss(out, img) / accumulation_steps
        optimizer.zero_grad()  # BUG
        optimizer_proj.zero_grad()
        loss.backward()
        if (i + 1) % accumulation_steps == 0:
            optimizer.step()
            optimizer_proj.step()
print("done")
