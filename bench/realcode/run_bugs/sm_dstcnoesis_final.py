# Source: https://github.com/IBM/dstc-noesis/issues/18
# Original: IBM/dstc7-noesis noesis/networks/dual_encoder.py (Encoder.forward, final_layer) and
# noesis/trainer (CrossEntropyLoss as the default loss)
# Bug: the dual encoder's scores go through an nn.Softmax final layer and the trainer's loss is
# nn.CrossEntropyLoss, which applies log_softmax itself.
import torch
from torch import nn

torch.manual_seed(0)


class DualEncoder(nn.Module):
    def __init__(self, vocab=60, hidden=24):
        super().__init__()
        self.embedding = nn.Embedding(vocab, hidden)
        self.rnn = nn.GRU(hidden, hidden, batch_first=True)
        self.M = nn.Parameter(torch.randn(hidden, hidden) * 0.1)
        self.final_layer = nn.Softmax(dim=1)

    def encode(self, tokens):
        _, h = self.rnn(self.embedding(tokens))
        return h[-1]

    def forward(self, context, options):
        c = self.encode(context) @ self.M
        n_options = options.size(1)
        o = self.encode(options.flatten(0, 1)).view(options.size(0), n_options, -1)
        logits = torch.bmm(o, c.unsqueeze(2)).squeeze(2)
        output = self.final_layer(logits)  # BUG
        return output


class Trainer:
    def __init__(self, loss_func=None, batch_size=8):
        self.loss_func = loss_func or nn.CrossEntropyLoss()
        self.batch_size = batch_size

    def train_batch(self, model, optimizer, context, options, target):
        output = model(context, options)
        loss = self.loss_func(output, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss.item()


model = DualEncoder()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
trainer = Trainer()
for step in range(40):
    context, options = torch.randint(0, 60, (8, 10)), torch.randint(0, 60, (8, 5, 6))
    target = torch.randint(0, 5, (8,))
    trainer.train_batch(model, optimizer, context, options, target)
print("done")
