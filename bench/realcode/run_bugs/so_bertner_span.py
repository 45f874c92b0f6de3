# Source: https://github.com/lonePatient/BERT-NER-Pytorch/issues/33
# Original: lonePatient/BERT-NER-Pytorch run_ner_span.py (train)
# Bug: after each accumulation boundary scheduler.step() is called before optimizer.step(), so the linear
# warm-up schedule skips its first value.
import torch

torch.manual_seed(0)
gradient_accumulation_steps = 2
model = torch.nn.Sequential(torch.nn.Embedding(100, 16), torch.nn.Flatten(), torch.nn.Linear(16 * 8, 5))
optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5)
t_total = 30
warmup_steps = 3
scheduler = torch.optim.lr_scheduler.LambdaLR(
    optimizer, lambda s: s / max(1, warmup_steps) if s < warmup_steps else max(0.0, (t_total - s) / (t_total - warmup_steps)))
global_step = 0
for epoch in range(1):
    for step in range(t_total * gradient_accumulation_steps):
        input_ids, labels = torch.randint(0, 100, (4, 8)), torch.randint(0, 5, (4,))
        loss = torch.nn.functional.cross_entropy(model(input_ids), labels)
        loss = loss / gradient_accumulation_steps
        loss.backward()
        if (step + 1) % gradient_accumulation_steps == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scheduler.step()  # BUG
            optimizer.step()
            model.zero_grad()
            global_step += 1
print("steps", global_step)
