"""A BERT-base classifier from a config (no download), padded batches with an attention mask."""
import argparse

import torch
from transformers import BertConfig, BertForSequenceClassification

p = argparse.ArgumentParser()
p.add_argument("--batch-size", type=int, default=16)
p.add_argument("--steps", type=int, default=20)
p.add_argument("--seq", type=int, default=512)
args = p.parse_args()
device = "cuda" if torch.cuda.is_available() else "cpu"

model = BertForSequenceClassification(BertConfig(num_labels=3)).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-5, weight_decay=0.01)
model.train()
for step in range(args.steps):
    ids = torch.randint(0, 30522, (args.batch_size, args.seq), device=device)
    mask = torch.ones_like(ids)
    mask[:, args.seq // 2:] = 0
    labels = torch.randint(0, 3, (args.batch_size,), device=device)
    out = model(input_ids=ids, attention_mask=mask, labels=labels)
    out.loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad()
    if step % 10 == 0:
        print(step, out.loss.item())
