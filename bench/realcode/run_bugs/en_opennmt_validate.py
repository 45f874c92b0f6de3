# Source: https://github.com/OpenNMT/OpenNMT-py/issues/1141
# Original: OpenNMT/OpenNMT-py onmt/trainer.py (Trainer.validate)
# Bug: validate() puts the model in eval mode but runs the validation forwards without torch.no_grad(), so every
# validation batch records an autograd graph that nothing uses.
import torch
import torch.nn.functional as F

torch.manual_seed(0)


class NMTModel(torch.nn.Module):
    def __init__(self, vocab, dim):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.encoder = torch.nn.GRU(dim, dim, batch_first=True)
        self.dropout = torch.nn.Dropout(0.1)
        self.generator = torch.nn.Linear(dim, vocab)

    def forward(self, src):
        out, _ = self.encoder(self.embed(src))
        return self.generator(self.dropout(out))


class Trainer:
    def __init__(self, model, optim):
        self.model, self.optim = model, optim

    def validate(self, valid_iter):
        self.model.eval()
        total, n = 0.0, 0
        for src, tgt in valid_iter:
            outputs = self.model(src)  # BUG
            loss = F.cross_entropy(outputs.reshape(-1, outputs.size(-1)), tgt.reshape(-1))
            total, n = total + loss.item(), n + 1
        self.model.train()
        return total / n

    def train(self, train_iter, valid_iter, train_steps, valid_steps):
        step = 0
        while step < train_steps:
            for src, tgt in train_iter:
                outputs = self.model(src)
                loss = F.cross_entropy(outputs.reshape(-1, outputs.size(-1)), tgt.reshape(-1))
                self.optim.zero_grad()
                loss.backward()
                self.optim.step()
                step += 1
                if step % valid_steps == 0:
                    print("step", step, "valid loss", round(self.validate(valid_iter), 4))
                if step >= train_steps:
                    break


vocab = 50
batches = [(torch.randint(0, vocab, (8, 10)), torch.randint(0, vocab, (8, 10))) for _ in range(10)]
valid = [(torch.randint(0, vocab, (8, 10)), torch.randint(0, vocab, (8, 10))) for _ in range(4)]
model = NMTModel(vocab, 32)
trainer = Trainer(model, torch.optim.Adam(model.parameters(), lr=1e-3))
trainer.train(batches, valid, train_steps=60, valid_steps=10)
