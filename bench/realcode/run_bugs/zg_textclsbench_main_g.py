# Source: https://github.com/FreedomIntelligence/TextClassificationBenchmark/issues/20
# Original: FreedomIntelligence/TextClassificationBenchmark main.py (the training loop) and utils.py (clip_gradient),
# models/LSTM.py (LSTMClassifier), at b5ac116
# Bug: optimizer.zero_grad() is called once, before the loops; every batch's backward adds to the gradients of all
# earlier batches, and the clamp-style clip_gradient then steps on that running sum (a later refactor into train()
# zeroes before each backward).
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim

torch.manual_seed(0)


class Opt:
    vocab_size, embedding_dim, hidden_dim, label_size, batch_size = 500, 32, 48, 3, 32
    learning_rate, grad_clip, max_epoch = 1e-3, 1e-1, 4


class LSTMClassifier(nn.Module):
    def __init__(self, opt):
        super().__init__()
        self.hidden_dim = opt.hidden_dim
        self.batch_size = opt.batch_size
        self.word_embeddings = nn.Embedding(opt.vocab_size, opt.embedding_dim)
        self.lstm = nn.LSTM(opt.embedding_dim, opt.hidden_dim)
        self.hidden2label = nn.Linear(opt.hidden_dim, opt.label_size)

    def init_hidden(self, batch_size):
        return torch.zeros(1, batch_size, self.hidden_dim), torch.zeros(1, batch_size, self.hidden_dim)

    def forward(self, sentence):
        x = self.word_embeddings(sentence).permute(1, 0, 2)
        self.hidden = self.init_hidden(sentence.size()[0])
        lstm_out, self.hidden = self.lstm(x, self.hidden)
        return self.hidden2label(lstm_out[-1])


def clip_gradient(optimizer, grad_clip):
    for group in optimizer.param_groups:
        for param in group["params"]:
            if param.grad is not None and param.requires_grad:
                param.grad.data.clamp_(-grad_clip, grad_clip)


class Batch:
    def __init__(self, text, label):
        self.text, self.label = text, label


def load_data(opt, n_batches=30, seq_len=20):
    """Sentences whose label is set by which of three keyword groups occurs most."""
    batches = []
    for _ in range(n_batches):
        text = torch.randint(10, opt.vocab_size, (opt.batch_size, seq_len))
        label = torch.randint(0, opt.label_size, (opt.batch_size,))
        keyword = 3 * label[:, None] + torch.randint(1, 4, (opt.batch_size, 6))
        text[:, torch.randperm(seq_len)[:6]] = keyword
        batches.append(Batch(text, label))
    return batches


opt = Opt()
train_iter = load_data(opt)
model = LSTMClassifier(opt)
model.train()
print("# parameters:", sum(param.numel() for param in model.parameters() if param.requires_grad))
optimizer = optim.Adam(filter(lambda p: p.requires_grad, model.parameters()), lr=opt.learning_rate)
optimizer.zero_grad()
loss_fun = F.cross_entropy
for i in range(opt.max_epoch):
    for epoch, batch in enumerate(train_iter):
        text = batch.text
        predicted = model(text)
        loss = loss_fun(predicted, batch.label)
        loss.backward()  # BUG
        clip_gradient(optimizer, opt.grad_clip)
        optimizer.step()
        if epoch % 20 == 0:
            print(f"{i} iteration {epoch} epoch with loss : {loss.item():.5f}")
