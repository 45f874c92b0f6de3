# Source: https://github.com/harvardnlp/annotated-transformer/issues/14
# Original: harvardnlp/annotated-transformer The Annotated Transformer (SimpleLossCompute, run_epoch)
# Bug: SimpleLossCompute calls loss.backward() also during validation (opt is None there), so the validation
# batches' gradients stay in .grad and the next training step applies them: the model trains on validation.
import torch

torch.manual_seed(0)
vocab, d = 16, 32


class SimpleLossCompute:
    def __init__(self, generator, criterion, opt=None):
        self.generator = generator
        self.criterion = criterion
        self.opt = opt

    def __call__(self, x, y, norm):
        x = self.generator(x)
        loss = self.criterion(x.contiguous().view(-1, x.size(-1)), y.contiguous().view(-1)) / norm
        loss.backward()  # BUG
        if self.opt is not None:
            self.opt.step()
            self.opt.zero_grad()
        return loss.item() * norm


def run_epoch(data, model, loss_compute):
    total = 0.0
    for src, tgt in data:
        out = model(src)
        total += loss_compute(out, tgt, tgt.numel())
    return total


model = torch.nn.Sequential(torch.nn.Embedding(vocab, d), torch.nn.Dropout(0.1), torch.nn.Linear(d, d), torch.nn.ReLU())
generator = torch.nn.Linear(d, vocab)
params = list(model.parameters()) + list(generator.parameters())
opt = torch.optim.Adam(params, lr=1e-3)
criterion = torch.nn.CrossEntropyLoss(reduction="sum")
train = [(torch.randint(0, vocab, (8, 6)), torch.randint(0, vocab, (8, 6))) for _ in range(10)]
valid = [(torch.randint(0, vocab, (8, 6)), torch.randint(0, vocab, (8, 6))) for _ in range(3)]
for epoch in range(4):
    model.train()
    run_epoch(train, model, SimpleLossCompute(generator, criterion, opt))
    model.eval()
    print(run_epoch(valid, model, SimpleLossCompute(generator, criterion, None)))
