# Source: https://github.com/shubhamagarwal92/mmd/issues/14
# Original: shubhamagarwal92/mmd train.py (train, evaluate)
# Bug: the periodic validation in train() calls evaluate(), which sets model.eval() to turn dropout off, and
# nothing calls model.train() afterwards: every training step after the first validation runs with dropout
# disabled (the reporters' fix: model.train() after the evaluate call).
import torch
import torch.nn.functional as F

torch.manual_seed(0)
vocab, hid, img_dim = 60, 48, 32


class MultimodalHRED(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, hid)
        self.utt_enc = torch.nn.GRU(hid, hid, batch_first=True)
        self.img_proj = torch.nn.Linear(img_dim, hid)
        self.ctx_enc = torch.nn.GRU(2 * hid, hid, batch_first=True)
        self.dropout = torch.nn.Dropout(0.3)
        self.decoder = torch.nn.GRU(hid, hid, batch_first=True)
        self.out = torch.nn.Linear(hid, vocab)

    def forward(self, context, images, target):
        b, turns, length = context.shape
        _, h = self.utt_enc(self.dropout(self.embed(context.view(b * turns, length))))
        turn_vecs = torch.cat([h[-1].view(b, turns, hid), self.img_proj(images)], -1)
        _, ctx = self.ctx_enc(self.dropout(turn_vecs))
        dec, _ = self.decoder(self.dropout(self.embed(target[:, :-1])), ctx)
        return self.out(self.dropout(dec))


def batch(n=16):
    return torch.randint(1, vocab, (n, 3, 6)), torch.randn(n, 3, img_dim), torch.randint(1, vocab, (n, 7))


def evaluate(model, val_batches):
    model.eval()
    losses = []
    with torch.no_grad():
        for context, images, target in val_batches:
            logits = model(context, images, target)
            losses.append(F.cross_entropy(logits.reshape(-1, vocab), target[:, 1:].reshape(-1)).item())
    return sum(losses) / len(losses)


def train(model, train_batches, val_batches, epochs, val_step=10):
    optimizer = torch.optim.Adam(model.parameters(), lr=4e-4)
    model.train()
    step = 0
    for epoch in range(epochs):
        for context, images, target in train_batches:
            logits = model(context, images, target)
            loss = F.cross_entropy(logits.reshape(-1, vocab), target[:, 1:].reshape(-1))
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            optimizer.step()
            step += 1
            if step % val_step == 0:
                val_loss = evaluate(model, val_batches)  # BUG
                print("step", step, "train", round(loss.item(), 3), "valid", round(val_loss, 3))


model = MultimodalHRED()
train(model, [batch() for _ in range(15)], [batch() for _ in range(3)], epochs=3)
