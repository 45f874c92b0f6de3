# Source: https://github.com/codertimo/BERT-pytorch/issues/92
# Original: codertimo/BERT-pytorch bert_pytorch/trainer/pretrain.py (BERTTrainer.train / test / iteration)
# Bug: train() and test() share iteration(epoch, data_loader, train); for the test set it runs the same
# forward with autograd on (no torch.no_grad()) and only skips the backward, so every test batch builds
# and holds a graph it never uses.
import torch
from torch.utils.data import DataLoader, TensorDataset

vocab, seq_len = 64, 16


class TinyBERTLM(torch.nn.Module):
    def __init__(self, hidden=32):
        super().__init__()
        self.embedding = torch.nn.Embedding(vocab, hidden)
        layer = torch.nn.TransformerEncoderLayer(hidden, 2, 64, dropout=0.1, batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, 1)
        self.next_sentence = torch.nn.Linear(hidden, 2)
        self.mask_lm = torch.nn.Linear(hidden, vocab)

    def forward(self, x):
        h = self.encoder(self.embedding(x))
        return self.next_sentence(h[:, 0]).log_softmax(-1), self.mask_lm(h).log_softmax(-1)


class BERTTrainer:
    def __init__(self, model, train_dataloader, test_dataloader, lr=1e-4):
        self.model, self.train_data, self.test_data = model, train_dataloader, test_dataloader
        self.optim = torch.optim.Adam(self.model.parameters(), lr=lr, betas=(0.9, 0.999), weight_decay=0.01)
        self.criterion = torch.nn.NLLLoss(ignore_index=0)

    def train(self, epoch):
        self.iteration(epoch, self.train_data)

    def test(self, epoch):
        self.iteration(epoch, self.test_data, train=False)

    def iteration(self, epoch, data_loader, train=True):
        avg_loss = 0.0
        for i, (bert_input, bert_label, is_next) in enumerate(data_loader):
            next_sent_output, mask_lm_output = self.model.forward(bert_input)  # BUG
            next_loss = self.criterion(next_sent_output, is_next)
            mask_loss = self.criterion(mask_lm_output.transpose(1, 2), bert_label)
            loss = next_loss + mask_loss
            if train:
                self.optim.zero_grad()
                loss.backward()
                self.optim.step()
            avg_loss += loss.item()
        print(f"EP{epoch}_{'train' if train else 'test'}, avg_loss={avg_loss / len(data_loader):.4f}")


def corpus(n, seed):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, vocab, (n, seq_len), generator=g)
    labels = torch.where(torch.rand(n, seq_len, generator=g) < 0.15, tokens, torch.zeros_like(tokens))
    return TensorDataset(torch.where(labels > 0, torch.ones_like(tokens), tokens), labels, torch.randint(0, 2, (n,), generator=g))


torch.manual_seed(0)
trainer = BERTTrainer(TinyBERTLM(), DataLoader(corpus(256, 0), batch_size=32, shuffle=True),
                      DataLoader(corpus(96, 1), batch_size=32))
for epoch in range(4):
    trainer.train(epoch)
    trainer.test(epoch)
