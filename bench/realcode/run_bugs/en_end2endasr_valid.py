# Source: https://github.com/gentaiscool/end2end-asr-pytorch/pull/41
# Original: gentaiscool/end2end-asr-pytorch trainer/asr/trainer.py (Trainer.train)
# Bug: the validation loop inside Trainer.train calls the model without torch.no_grad(), keeping autograd
# graphs and running out of memory during validation; the fix wraps the forward in no_grad.
import torch
import torch.nn.functional as F

torch.manual_seed(0)
vocab = 30


class Transformer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = torch.nn.GRU(40, 32, batch_first=True)
        self.decoder = torch.nn.Linear(32, vocab)

    def forward(self, src, tgt):
        enc, _ = self.encoder(src)
        return self.decoder(enc), tgt


class Trainer:
    def train(self, model, train_loader, valid_loader, opt, num_epochs=3):
        for epoch in range(num_epochs):
            model.train()
            for src, tgt in train_loader:
                opt.zero_grad()
                pred, gold = model(src, tgt)
                loss = F.cross_entropy(pred.reshape(-1, vocab), gold.reshape(-1))
                loss.backward()
                opt.step()
            model.eval()
            total_valid_loss = 0.0
            for src, tgt in valid_loader:
                pred, gold = model(src, tgt)  # BUG
                total_valid_loss += F.cross_entropy(pred.reshape(-1, vocab), gold.reshape(-1)).item()
            print("epoch", epoch, "valid", total_valid_loss / len(valid_loader))


def batches(n):
    return [(torch.randn(4, 12, 40), torch.randint(0, vocab, (4, 12))) for _ in range(n)]


model = Transformer()
Trainer().train(model, batches(10), batches(4), torch.optim.Adam(model.parameters(), lr=1e-3))
