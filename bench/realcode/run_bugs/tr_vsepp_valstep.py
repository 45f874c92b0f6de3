# Source: https://github.com/fartashf/vsepp/issues/4
# Original: fartashf/vsepp train.py (train, validate) and evaluation.py (encode_data), model.py (VSE.val_start)
# Bug: validation runs every val_step iterations inside the epoch; encode_data switches both encoders to eval
# mode and nothing switches them back until train_start() at the next epoch, so after the first validation
# the rest of the epoch trains with dropout off and batch norm frozen.
import torch
import torch.nn.functional as F

torch.manual_seed(0)


class EncoderImage(torch.nn.Module):
    def __init__(self, img_dim, embed_size):
        super().__init__()
        self.cnn = torch.nn.Sequential(torch.nn.Linear(img_dim, 96), torch.nn.BatchNorm1d(96), torch.nn.ReLU(),
                                       torch.nn.Dropout(0.5))
        self.fc = torch.nn.Linear(96, embed_size)

    def forward(self, images):
        return F.normalize(self.fc(self.cnn(images)), dim=1)


class EncoderText(torch.nn.Module):
    def __init__(self, vocab_size, word_dim, embed_size):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab_size, word_dim)
        self.rnn = torch.nn.GRU(word_dim, embed_size, batch_first=True)

    def forward(self, captions):
        out, _ = self.rnn(self.embed(captions))
        return F.normalize(out[:, -1], dim=1)


def contrastive_loss(im, s, margin=0.2):
    scores = im @ s.t()
    diagonal = scores.diag().view(-1, 1)
    cost_s = (margin + scores - diagonal).clamp(min=0)
    cost_im = (margin + scores - diagonal.t()).clamp(min=0)
    mask = torch.eye(scores.size(0), dtype=torch.bool)
    return cost_s.masked_fill(mask, 0).sum() + cost_im.masked_fill(mask, 0).sum()


class VSE:
    def __init__(self, opt):
        self.img_enc = EncoderImage(opt["img_dim"], opt["embed_size"])
        self.txt_enc = EncoderText(opt["vocab_size"], 32, opt["embed_size"])
        self.params = list(self.txt_enc.parameters()) + list(self.img_enc.parameters())
        self.optimizer = torch.optim.Adam(self.params, lr=2e-4)
        self.Eiters = 0

    def train_start(self):
        self.img_enc.train()
        self.txt_enc.train()

    def val_start(self):
        self.img_enc.eval()
        self.txt_enc.eval()

    def forward_emb(self, images, captions):
        return self.img_enc(images), self.txt_enc(captions)

    def train_emb(self, images, captions):
        self.Eiters += 1
        img_emb, cap_emb = self.forward_emb(images, captions)
        self.optimizer.zero_grad()
        loss = contrastive_loss(img_emb, cap_emb)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, 2.0)
        self.optimizer.step()


def encode_data(model, data_loader):
    model.val_start()
    img_embs, cap_embs = [], []
    with torch.no_grad():
        for images, captions in data_loader:
            img_emb, cap_emb = model.forward_emb(images, captions)
            img_embs.append(img_emb)
            cap_embs.append(cap_emb)
    return torch.cat(img_embs), torch.cat(cap_embs)


def validate(opt, val_loader, model):
    img_embs, cap_embs = encode_data(model, val_loader)
    ranks = (img_embs @ cap_embs.t()).argsort(dim=1, descending=True)
    r1 = (ranks[:, 0] == torch.arange(len(ranks))).float().mean().item() * 100
    return r1


def train(opt, train_loader, model, epoch, val_loader):
    model.train_start()
    for i, (images, captions) in enumerate(train_loader):
        model.train_emb(images, captions)
        if model.Eiters % opt["val_step"] == 0:
            validate(opt, val_loader, model)  # BUG


opt = {"img_dim": 64, "embed_size": 48, "vocab_size": 100, "val_step": 8}
train_loader = [(torch.randn(16, 64), torch.randint(0, 100, (16, 7))) for _ in range(24)]
val_loader = [(torch.randn(16, 64), torch.randint(0, 100, (16, 7))) for _ in range(2)]
model = VSE(opt)
for epoch in range(3):
    train(opt, train_loader, model, epoch, val_loader)
    rsum = validate(opt, val_loader, model)
    print("epoch", epoch, "r1", round(rsum, 1))
