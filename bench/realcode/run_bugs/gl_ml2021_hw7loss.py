# Source: https://github.com/pai4451/ML2021/issues/2
# Original: pai4451/ML2021 hw7/hw7_macbert4.ipynb (the HW7 extractive-QA training cell, BERT + Accelerate)
# Bug: train_loss += output.loss adds the loss tensor itself, so the running sum holds every step's autograd graph
# (and the saved BERT activations behind it) until it is reset every logging_step steps (fix: output.loss.detach()
# or .item(), as the maintainer answered).
import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset
from transformers import BertConfig, BertForQuestionAnswering, get_linear_schedule_with_warmup

torch.manual_seed(0)
accelerator = Accelerator(cpu=True)
device = accelerator.device

config = BertConfig(vocab_size=200, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=128, max_position_embeddings=64)
model = BertForQuestionAnswering(config)


def make_qa_set(n, seq_len=32):
    """Question tokens, [SEP], a paragraph with the answer span wrapped in marker tokens 5 and 6."""
    input_ids = torch.randint(10, 200, (n, seq_len))
    input_ids[:, 0], input_ids[:, 8] = 2, 3
    token_type_ids = torch.zeros(n, seq_len, dtype=torch.long)
    token_type_ids[:, 9:] = 1
    start = torch.randint(12, seq_len - 6, (n,))
    end = start + torch.randint(0, 4, (n,))
    for i in range(n):
        input_ids[i, start[i] - 1], input_ids[i, end[i] + 1] = 5, 6
    attention_mask = torch.ones(n, seq_len, dtype=torch.long)
    return TensorDataset(input_ids, token_type_ids, attention_mask, start, end)


train_loader = DataLoader(make_qa_set(160), batch_size=8, shuffle=True)
num_epoch = 2
logging_step = 15
learning_rate = 3e-4
optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
model, optimizer, train_loader = accelerator.prepare(model, optimizer, train_loader)
total_steps = len(train_loader) * num_epoch
scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=0, num_training_steps=total_steps)

model.train()
print("Start Training ...")
for epoch in range(num_epoch):
    step = 1
    train_loss = train_acc = 0
    for idx, data in enumerate(train_loader):
        data = [i.to(device) for i in data]
        output = model(input_ids=data[0], token_type_ids=data[1], attention_mask=data[2], start_positions=data[3],
                       end_positions=data[4])
        start_index = torch.argmax(output.start_logits, dim=1)
        end_index = torch.argmax(output.end_logits, dim=1)
        train_acc += ((start_index == data[3]) & (end_index == data[4])).float().mean()
        train_loss += output.loss  # BUG
        accelerator.backward(output.loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        step += 1
        if step % logging_step == 0:
            print(f"Epoch {epoch + 1} | Step {step} | loss = {train_loss.item() / logging_step:.3f}, "
                  f"acc = {train_acc / logging_step:.3f}")
            train_loss = train_acc = 0
