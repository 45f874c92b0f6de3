"""A Hugging Face GPT-2 built from a config (no download), trained with a plain loop."""
import argparse

import torch
from transformers import GPT2Config, GPT2LMHeadModel

p = argparse.ArgumentParser()
p.add_argument("--batch-size", type=int, default=8)
p.add_argument("--steps", type=int, default=20)
p.add_argument("--amp", choices=["none", "bf16"], default="none")
p.add_argument("--ckpt", action="store_true")
args = p.parse_args()
device = "cuda" if torch.cuda.is_available() else "cpu"

config = GPT2Config(n_embd=1024, n_layer=12, n_head=16, n_positions=1024, vocab_size=50257)
model = GPT2LMHeadModel(config).to(device)
if args.ckpt:
    model.gradient_checkpointing_enable()
model.train()
optimizer = torch.optim.AdamW(model.parameters(), lr=2e-4)
for step in range(args.steps):
    input_ids = torch.randint(0, config.vocab_size, (args.batch_size, 1024), device=device)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.amp == "bf16"):
        out = model(input_ids=input_ids, labels=input_ids)
    out.loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    if step % 10 == 0:
        print(step, out.loss.item())
