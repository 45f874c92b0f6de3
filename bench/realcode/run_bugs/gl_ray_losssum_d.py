# Source: https://github.com/ray-project/ray/pull/40940 (issues #40714, #40984)
# Original: ray-project/ray doc/source/templates/04_finetuning_llms_with_deepspeed/finetune_hf_llm.py
# (training_function)
# Bug: the per-epoch loss sum is a tensor and each step adds the loss itself to it, so loss_sum carries an
# autograd history that links every step's graph since the start of the epoch; memory grows each iteration
# until the epoch ends (the fix adds loss.item()).
import math
from types import SimpleNamespace

import torch
import torch.nn.functional as F

torch.manual_seed(0)


class TinyCausalLM(torch.nn.Module):
    def __init__(self, vocab=96, dim=32, layers=2):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        layer = torch.nn.TransformerEncoderLayer(dim, 4, 4 * dim, dropout=0.1, batch_first=True)
        self.blocks = torch.nn.TransformerEncoder(layer, layers)
        self.lm_head = torch.nn.Linear(dim, vocab)

    def forward(self, input_ids, labels=None):
        mask = torch.nn.Transformer.generate_square_subsequent_mask(input_ids.shape[1])
        logits = self.lm_head(self.blocks(self.embed(input_ids), mask=mask, is_causal=True))
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1))
        return SimpleNamespace(loss=loss, logits=logits)


def collate_fn(rows):
    input_ids = torch.stack(list(rows))
    return {"input_ids": input_ids, "labels": input_ids.clone()}


def evaluate(model, eval_ds, bsize):
    model.eval()
    losses = []
    with torch.no_grad():
        for i in range(0, len(eval_ds), bsize):
            losses.append(model(**collate_fn(eval_ds[i:i + bsize])).loss.item())
    model.train()
    loss = sum(losses) / len(losses)
    return math.exp(loss), loss


def training_function(config):
    train_ds, valid_ds = config["train_ds"], config["valid_ds"]
    batch_size = config["batch_size"]
    model = TinyCausalLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=config["lr"], betas=(0.9, 0.999), weight_decay=0.0)
    num_steps_per_epoch = math.ceil(len(train_ds) / batch_size)
    lr_scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / 10) * max(0.0, 1 - s / (num_steps_per_epoch * config["num_epochs"])))
    for epoch in range(config["num_epochs"]):
        model.train()
        loss_sum = torch.tensor(0.0)
        train_dataloader = [collate_fn(train_ds[i:i + batch_size]) for i in range(0, len(train_ds), batch_size)]
        for step, batch in enumerate(train_dataloader):
            outputs = model(**batch)
            loss = outputs.loss
            loss_sum += loss  # BUG
            loss.backward()
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()
        perplex, eloss = evaluate(model, valid_ds, config["eval_batch_size"])
        print("epoch", epoch, "avg_train_loss_epoch", round(loss_sum.item() / (step + 1), 4),
              "eval_loss", round(eloss, 4), "perplexity", round(perplex, 2))


training_function({
    "train_ds": torch.randint(0, 96, (320, 17)), "valid_ds": torch.randint(0, 96, (32, 17)),
    "batch_size": 8, "eval_batch_size": 32, "lr": 3e-4, "num_epochs": 2,
})
