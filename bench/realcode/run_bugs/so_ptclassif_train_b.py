# Source: https://github.com/ThilinaRajapakse/pytorch-transformers-classification/issues/21
# Original: ThilinaRajapakse/pytorch-transformers-classification run_model.ipynb / utils (train)
# Bug: the accumulation branch of train() steps the warmup-linear scheduler before the optimizer, so the first
# optimizer step already runs at the second value of the schedule (torch warns; the maintainer reordered the calls).
import torch
from transformers import BertConfig, BertForSequenceClassification, get_linear_schedule_with_warmup

torch.manual_seed(0)
args = {"train_batch_size": 8, "gradient_accumulation_steps": 1, "num_train_epochs": 2, "learning_rate": 4e-5,
        "adam_epsilon": 1e-8, "warmup_steps": 4, "max_grad_norm": 1.0, "max_seq_length": 16}


def train(train_dataset, model):
    bs = args["train_batch_size"]
    batches = [tuple(torch.stack(col) for col in zip(*train_dataset[i:i + bs])) for i in range(0, len(train_dataset), bs)]
    t_total = len(batches) // args["gradient_accumulation_steps"] * args["num_train_epochs"]
    no_decay = ["bias", "LayerNorm.weight"]
    grouped = [
        {"params": [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)], "weight_decay": 0.0},
        {"params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(grouped, lr=args["learning_rate"], eps=args["adam_epsilon"])
    scheduler = get_linear_schedule_with_warmup(optimizer, args["warmup_steps"], t_total)
    global_step, tr_loss = 0, 0.0
    model.zero_grad()
    for _ in range(args["num_train_epochs"]):
        for step, batch in enumerate(batches):
            model.train()
            input_ids, attention_mask, labels = batch
            outputs = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
            loss = outputs[0]
            if args["gradient_accumulation_steps"] > 1:
                loss = loss / args["gradient_accumulation_steps"]
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), args["max_grad_norm"])
            tr_loss += loss.item()
            if (step + 1) % args["gradient_accumulation_steps"] == 0:
                scheduler.step()  # BUG
                optimizer.step()
                model.zero_grad()
                global_step += 1
    return global_step, tr_loss / global_step


config = BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                    max_position_embeddings=32, num_labels=2)
model = BertForSequenceClassification(config)
ids = torch.randint(1, 120, (96, args["max_seq_length"]))
train_dataset = [(row, torch.ones_like(row), (row[0] > 60).long()) for row in ids]
global_step, avg_loss = train(train_dataset, model)
print(f"global_step = {global_step}, average loss = {avg_loss}")
