"""Gradients zeroed on every micro-step of an accumulation loop (unsupervised SimCSE training).

Source: https://github.com/bhuvanakundumani/SimCSE_unsupervised/issues/1 (open, unanswered)
Read: train.py at 02c9bcc1a6ca21b7b7524e4d0eae6cab0f000955 and model.py at 2125e7707efacd1167d723098ebaf2ef419c23c6.
Theirs: the training loop (optimizer.zero_grad() at the top of every micro-step, the loss divided by
gradient_accumulation_steps, the step/scheduler/model.zero_grad() under the accumulation test and the stray
optimizer.step() after it), BertForCL with cl_init/cl_forward (CLS pooler, MLP head, cosine similarity / temperature,
cross-entropy over in-batch pairs), AdamW with no-decay groups and get_linear_schedule_with_warmup.
Ours: a tiny random BertConfig instead of bert-base-uncased, random token ids instead of wiki1m, a plain list of
batches, gradient_accumulation_steps = 4 (theirs defaults to 1, where the zeroing is harmless), fewer steps.
"""
import torch
import torch.nn as nn
from torch.optim import AdamW
from transformers import BertConfig, get_linear_schedule_with_warmup
from transformers.models.bert.modeling_bert import BertModel, BertPreTrainedModel


class Arguments:
    def __init__(self):
        self.learning_rate = 3e-5
        self.adam_epsilon = 1e-8
        self.warmup_proportion = 0.1
        self.weight_decay = 0.01
        self.num_train_epochs = 1
        self.gradient_accumulation_steps = 4
        self.batch_size = 8
        self.temp = 0.05


args = Arguments()


class MLPLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = nn.Tanh()

    def forward(self, features):
        return self.activation(self.dense(features))


class Similarity(nn.Module):
    def __init__(self, temp):
        super().__init__()
        self.temp = temp
        self.cos = nn.CosineSimilarity(dim=-1)

    def forward(self, x, y):
        return self.cos(x, y) / self.temp


class BertForCL(BertPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.bert = BertModel(config)
        self.mlp = MLPLayer(config)
        self.sim = Similarity(temp=args.temp)
        self.post_init()

    def forward(self, input_ids, attention_mask, token_type_ids):
        batch_size = int(input_ids.size(0) / 2)
        outputs = self.bert(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids, return_dict=True)
        pooler_output = outputs.last_hidden_state[:, 0]
        pooler_output = pooler_output.view((batch_size, 2, pooler_output.size(-1)))
        pooler_output = self.mlp(pooler_output)
        z1, z2 = pooler_output[:, 0], pooler_output[:, 1]
        cos_sim = self.sim(z1.unsqueeze(1), z2.unsqueeze(0))
        labels = torch.arange(cos_sim.size(0)).long()
        loss = nn.CrossEntropyLoss()(cos_sim, labels)
        return {"loss": loss, "logits": cos_sim}


torch.manual_seed(1)
config = BertConfig(vocab_size=200, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=64, max_position_embeddings=64)
model = BertForCL(config)


def make_batch():
    ids = torch.randint(5, 200, (args.batch_size, 16))
    ids = ids.repeat_interleave(2, dim=0)  # each sentence twice: dropout makes the positive pair
    return ids, torch.ones_like(ids), torch.zeros_like(ids)


train_dataloader = [make_batch() for _ in range(24)]
num_train_optimization_steps = int(len(train_dataloader) / args.gradient_accumulation_steps) * args.num_train_epochs

param_optimizer = list(model.named_parameters())
no_decay = ["bias", "LayerNorm.weight"]
optimizer_grouped_parameters = [
    {"params": [p for n, p in param_optimizer if not any(nd in n for nd in no_decay)], "weight_decay": args.weight_decay},
    {"params": [p for n, p in param_optimizer if any(nd in n for nd in no_decay)], "weight_decay": 0.0},
]
warmup_steps = int(args.warmup_proportion * num_train_optimization_steps)
optimizer = AdamW(optimizer_grouped_parameters, lr=args.learning_rate, eps=args.adam_epsilon)
scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=warmup_steps,
                                            num_training_steps=num_train_optimization_steps)

for epoch in range(args.num_train_epochs):
    model.train()
    running_loss = 0.0
    for step, batch in enumerate(train_dataloader):
        input_ids, attention_mask, token_type_ids = batch
        # zero the parameter gradients
        optimizer.zero_grad()  # BUG
        outputs = model(input_ids, attention_mask, token_type_ids)
        loss = outputs["loss"]
        if args.gradient_accumulation_steps > 1:
            loss = loss / args.gradient_accumulation_steps
        loss.backward()
        running_loss += loss.item()
        if (step + 1) % args.gradient_accumulation_steps == 0:
            optimizer.step()
            scheduler.step()  # Update learning rate schedule
            model.zero_grad()
        optimizer.step()
    print("Epoch Loss", running_loss)
