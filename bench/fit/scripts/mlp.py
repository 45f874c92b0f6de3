"""A wide MLP classifier on synthetic features (AdamW, fp32 or bf16 autocast)."""
import argparse

import torch
import torch.nn as nn

p = argparse.ArgumentParser()
p.add_argument("--batch-size", type=int, default=256)
p.add_argument("--steps", type=int, default=20)
p.add_argument("--amp", choices=["none", "bf16"], default="none")
args = p.parse_args()
device = "cuda" if torch.cuda.is_available() else "cpu"

model = nn.Sequential(
    nn.Linear(2048, 8192), nn.GELU(), nn.Dropout(0.1),
    nn.Linear(8192, 8192), nn.GELU(), nn.Dropout(0.1),
    nn.Linear(8192, 8192), nn.GELU(),
    nn.Linear(8192, 1000),
).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
loss_fn = nn.CrossEntropyLoss()

for step in range(args.steps):
    x = torch.randn(args.batch_size, 2048, device=device)
    y = torch.randint(0, 1000, (args.batch_size,), device=device)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.amp == "bf16"):
        loss = loss_fn(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if step % 10 == 0:
        print(f"step {step} loss {loss.item():.4f}")
