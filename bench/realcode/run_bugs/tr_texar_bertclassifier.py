# Source: https://github.com/asyml/texar-pytorch/issues/310 (fixed by PR #311)
# Original: asyml/texar-pytorch examples/bert/bert_classifier_main.py (_train_epoch / _eval_epoch)
# Bug: _train_epoch calls _eval_epoch() every eval_steps optimizer steps; _eval_epoch sets model.eval() and
# the training loop never switches back, so the rest of the epoch trains with dropout off.
import torch
import torch.nn.functional as F

torch.manual_seed(0)
vocab, hidden, num_classes = 50, 32, 3
model = torch.nn.Sequential(torch.nn.Embedding(vocab, hidden), torch.nn.Dropout(0.1), torch.nn.Flatten(),
                            torch.nn.Linear(hidden * 12, hidden), torch.nn.Tanh(), torch.nn.Dropout(0.1),
                            torch.nn.Linear(hidden, num_classes))
optim = torch.optim.Adam(model.parameters(), lr=2e-5)
scheduler = torch.optim.lr_scheduler.LambdaLR(optim, lambda step: min(1.0, (step + 1) / 10))
train_data = [(torch.randint(0, vocab, (8, 12)), torch.randint(0, num_classes, (8,))) for _ in range(30)]
eval_data = [(torch.randint(0, vocab, (8, 12)), torch.randint(0, num_classes, (8,))) for _ in range(3)]
eval_steps = 10


def _eval_epoch():
    model.eval()
    correct = 0
    with torch.no_grad():
        for input_ids, labels in eval_data:
            correct += (model(input_ids).argmax(-1) == labels).sum().item()
    print("eval accuracy", correct / (8 * len(eval_data)))


def _train_epoch():
    model.train()
    for input_ids, labels in train_data:
        optim.zero_grad()
        logits = model(input_ids)
        loss = F.cross_entropy(logits, labels)
        loss.backward()
        optim.step()
        scheduler.step()
        step = scheduler.last_epoch
        if eval_steps > 0 and step % eval_steps == 0:
            _eval_epoch()  # BUG


for epoch in range(2):
    _train_epoch()
print("done")
