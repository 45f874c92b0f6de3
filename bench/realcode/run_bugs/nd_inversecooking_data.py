# Source: https://github.com/facebookresearch/inversecooking/issues/8
# Original: facebookresearch/inversecooking src/modules/transformer_decoder.py (DecoderTransformer.sample)
# and src/model.py (InverseCookingModel.forward)
# Bug: sample() returns torch.stack(logits, 1).data, and the ingredient decoder's set-prediction loss is
# computed on those sampled logits, so the loss has no path to the decoder's parameters.
import torch
import torch.nn.functional as F

torch.manual_seed(0)
n_ingr, max_len, dim = 20, 5, 16


class DecoderTransformer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(n_ingr, dim)
        self.cell = torch.nn.GRUCell(dim, dim)
        self.out = torch.nn.Linear(dim, n_ingr)

    def sample(self, features):
        h, tok = features, torch.zeros(features.shape[0], dtype=torch.long)
        logits = []
        for _ in range(max_len):
            h = self.cell(self.embed(tok), h)
            step_logits = self.out(h)
            logits.append(step_logits)
            tok = step_logits.argmax(-1)
        return torch.stack(logits, 1).data  # BUG


class InverseCookingModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.image_encoder = torch.nn.Linear(32, dim)
        self.ingredient_decoder = DecoderTransformer()

    def forward(self, img, target_ingrs):
        features = self.image_encoder(img)
        ingr_logits = self.ingredient_decoder.sample(features)
        ingr_probs = torch.sigmoid(ingr_logits).max(1)[0]
        ingr_loss = F.binary_cross_entropy(ingr_probs, target_ingrs)
        card_loss = features.pow(2).mean() * 1e-3   # the cardinality/eos terms still reach the encoder
        return ingr_loss + card_loss


model = InverseCookingModel()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
for step in range(30):
    img, target = torch.randn(8, 32), (torch.rand(8, n_ingr) > 0.8).float()
    loss = model(img, target)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("done")
