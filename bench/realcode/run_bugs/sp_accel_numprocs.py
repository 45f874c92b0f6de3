# Source: https://github.com/huggingface/transformers/issues/26827
# Original: huggingface/transformers examples/pytorch/translation/run_translation_no_trainer.py (get_scheduler with
# num_training_steps=args.max_train_steps, the scheduler prepared by accelerate; the examples were later changed
# to multiply both step counts by accelerator.num_processes)
# Bug: max_train_steps counts one process's optimizer steps (the prepared loader is already sharded), but the
# prepared scheduler is stepped num_processes times per optimizer step, so with 2 processes the linear schedule
# reaches 0 halfway through training and the second half trains with a learning rate of 0. Run with torchrun,
# 2 processes (gloo); a tiny seq2seq stand-in for t5-small.
import math
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from transformers import get_scheduler

torch.manual_seed(0)


class TinySeq2Seq(torch.nn.Module):
    def __init__(self, vocab=64, dim=32):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, dim)
        self.body = torch.nn.Sequential(torch.nn.Linear(dim, dim), torch.nn.GELU())
        self.lm_head = torch.nn.Linear(dim, vocab)

    def forward(self, input_ids, labels):
        logits = self.lm_head(self.body(self.emb(input_ids)))
        return SimpleNamespace(loss=F.cross_entropy(logits.flatten(0, 1), labels.flatten()), logits=logits)


args = SimpleNamespace(per_device_train_batch_size=8, gradient_accumulation_steps=1, num_train_epochs=3,
                       max_train_steps=None, lr_scheduler_type="linear", num_warmup_steps=0, learning_rate=5e-3)
accelerator = Accelerator(cpu=True)
source = torch.randint(0, 64, (512, 10))
dataset = torch.utils.data.TensorDataset(source, (source * 7 + 3) % 64)
train_dataloader = torch.utils.data.DataLoader(dataset, batch_size=args.per_device_train_batch_size, shuffle=True)
model = TinySeq2Seq()
optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate)
model, optimizer, train_dataloader = accelerator.prepare(model, optimizer, train_dataloader)

num_update_steps_per_epoch = math.ceil(len(train_dataloader) / args.gradient_accumulation_steps)
if args.max_train_steps is None:
    args.max_train_steps = args.num_train_epochs * num_update_steps_per_epoch
lr_scheduler = get_scheduler(name=args.lr_scheduler_type, optimizer=optimizer,
                             num_warmup_steps=args.num_warmup_steps,
                             num_training_steps=args.max_train_steps)  # BUG
lr_scheduler = accelerator.prepare(lr_scheduler)

completed_steps = 0
for epoch in range(args.num_train_epochs):
    model.train()
    for batch in train_dataloader:
        input_ids, labels = batch
        outputs = model(input_ids=input_ids, labels=labels)
        loss = outputs.loss / args.gradient_accumulation_steps
        accelerator.backward(loss)
        optimizer.step()
        lr_scheduler.step()
        optimizer.zero_grad()
        completed_steps += 1
    accelerator.print(f"epoch {epoch} step {completed_steps}/{args.max_train_steps} lr {lr_scheduler.get_last_lr()[0]:.2e}"
                      f" loss {loss.item():.3f}")
