# Source: https://github.com/lucidrains/CoCa-pytorch/issues/6
# Original: lucidrains/vit-pytorch vit_pytorch/extractor.py (Extractor._hook), used as CoCa's image encoder
# Bug: the Extractor's forward hook stores the ViT's embeddings as output.clone().detach(), so CoCa's
# contrastive and captioning losses never reach the image encoder: the ViT gets no gradient and stays at its
# initial weights (fixed in vit-pytorch 0.35.8 with a detach flag off by default).
import torch
import torch.nn.functional as F

torch.manual_seed(0)
dim, vocab, seq = 32, 50, 8


class ViT(torch.nn.Module):
    def __init__(self, patch=4, image=16):
        super().__init__()
        self.to_patch = torch.nn.Linear(3 * patch * patch, dim)
        self.pos = torch.nn.Parameter(torch.randn(1, (image // patch) ** 2, dim) * 0.02)
        self.transformer = torch.nn.TransformerEncoder(
            torch.nn.TransformerEncoderLayer(dim, 4, 64, dropout=0.0, batch_first=True), 2)
        self.mlp_head = torch.nn.Linear(dim, 10)
        self.patch = patch

    def forward(self, img):
        p = self.patch
        x = img.unfold(2, p, p).unfold(3, p, p).permute(0, 2, 3, 1, 4, 5).flatten(3).flatten(1, 2)
        x = self.transformer(self.to_patch(x) + self.pos)
        return self.mlp_head(x.mean(1))


class Extractor(torch.nn.Module):
    def __init__(self, vit):
        super().__init__()
        self.vit = vit
        self.latents = None
        self.hook_registered = False

    def _hook(self, _, inputs, output):
        self.latents = output.clone().detach()  # BUG

    def forward(self, img):
        if not self.hook_registered:
            self.vit.transformer.register_forward_hook(self._hook)
            self.hook_registered = True
        self.latents = None
        pred = self.vit(img)
        return pred, self.latents


class CoCa(torch.nn.Module):
    def __init__(self, img_encoder):
        super().__init__()
        self.img_encoder = img_encoder
        self.token_emb = torch.nn.Embedding(vocab, dim)
        self.text_cls = torch.nn.Parameter(torch.randn(dim))
        self.decoder = torch.nn.TransformerDecoder(
            torch.nn.TransformerDecoderLayer(dim, 4, 64, dropout=0.0, batch_first=True), 1)
        self.to_logits = torch.nn.Linear(dim, vocab)
        self.temperature = torch.nn.Parameter(torch.tensor(1.0))

    def forward(self, text, images):
        _, image_tokens = self.img_encoder(images)
        image_embeds = F.normalize(image_tokens.mean(1), dim=-1)
        text_tokens = self.token_emb(text[:, :-1])
        text_embeds = F.normalize(text_tokens.mean(1) + self.text_cls, dim=-1)
        mask = torch.triu(torch.ones(seq - 1, seq - 1, dtype=torch.bool), 1)
        out = self.decoder(text_tokens, image_tokens, tgt_mask=mask)
        caption_loss = F.cross_entropy(self.to_logits(out).transpose(1, 2), text[:, 1:])
        sim = text_embeds @ image_embeds.t() * self.temperature.exp()
        labels = torch.arange(len(text))
        contrastive_loss = (F.cross_entropy(sim, labels) + F.cross_entropy(sim.t(), labels)) / 2
        return caption_loss + contrastive_loss


vit = ViT()
coca = CoCa(Extractor(vit))
optimizer = torch.optim.AdamW(coca.parameters(), lr=3e-4)
for step in range(40):
    images = torch.randn(8, 3, 16, 16)
    text = torch.randint(0, vocab, (8, seq))
    loss = coca(text, images)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("loss", loss.item())
