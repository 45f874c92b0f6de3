# Source: https://github.com/GitHub-HongweiZhang/prediction-flow/pull/10
# Original: GitHub-HongweiZhang/prediction-flow prediction_flow/pytorch/dien.py (DIEN.forward),
# prediction_flow/pytorch/nn/interest.py (Interest.auxiliary_loss, forward) and prediction_flow/pytorch/functions.py
# (fit), read at 796ae7a^
# Bug: DIEN.forward collects each attention group's auxiliary (negative-sampling) loss in a list and returns
# torch.mean(torch.tensor(auxiliary_loss)): torch.tensor copies the values into a new leaf, so the auxiliary loss
# that fit() adds to the click loss carries no graph. The auxiliary network never receives a gradient and the
# interest extractor is trained by the click loss alone. The fix sums the loss tensors themselves.
# Ours: one attention group, fixed-length behaviour sequences, a plain GRU interest evolution, synthetic clicks.
from collections import OrderedDict

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

torch.manual_seed(0)
N_ITEMS, EMB, T = 50, 8, 10


class AuxiliaryNet(nn.Module):
    def __init__(self, input_size, hidden_layers):
        super().__init__()
        layers, size = [], input_size
        for h in hidden_layers:
            layers += [nn.Linear(size, h), nn.Sigmoid()]
            size = h
        layers += [nn.Linear(size, 1), nn.Sigmoid()]
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x)


class Interest(nn.Module):
    def __init__(self, input_size, use_negsampling=True):
        super().__init__()
        self.use_negsampling = use_negsampling
        self.interest_extractor = nn.GRU(input_size, input_size, batch_first=True)
        self.auxiliary_net = AuxiliaryNet(input_size * 2, hidden_layers=[32, 16])
        self.interest_evolution = nn.GRU(input_size, input_size, batch_first=True)
        self.attention = nn.Sequential(nn.Linear(input_size * 4, 32), nn.PReLU(), nn.Linear(32, 1))

    def auxiliary_loss(self, states, click_seq, noclick_seq):
        batch_size, max_seq_length, embedding_size = states.size()
        click_input = torch.cat([states, click_seq], dim=-1).view(-1, embedding_size * 2)
        noclick_input = torch.cat([states, noclick_seq], dim=-1).view(-1, embedding_size * 2)
        click_p = self.auxiliary_net(click_input).view(batch_size, max_seq_length)
        noclick_p = self.auxiliary_net(noclick_input).view(batch_size, max_seq_length)
        loss = torch.mean(torch.log(click_p) + torch.log(1.0 - noclick_p))
        return -loss

    def forward(self, query, keys, neg_keys=None):
        interests, _ = self.interest_extractor(keys)
        loss = torch.tensor(0.0)
        if self.use_negsampling:
            loss = self.auxiliary_loss(interests[:, :-1, :], keys[:, 1:, :], neg_keys[:, 1:, :])
        interests, _ = self.interest_evolution(interests)
        q = query.unsqueeze(1).expand_as(interests)
        scores = self.attention(torch.cat([q, interests, q * interests, q - interests], -1)).softmax(1)
        return (scores * interests).sum(1), loss


class DIEN(nn.Module):
    def __init__(self):
        super().__init__()
        self.embeddings = nn.ModuleDict({"item_id": nn.Embedding(N_ITEMS, EMB)})
        self._attention_poolings = nn.ModuleDict({"hist": Interest(EMB)})
        self.mlp = nn.Sequential(nn.Linear(EMB * 2, 32), nn.ReLU())
        self.final_layer = nn.Linear(32, 1)

    def forward(self, x):
        embeddings = OrderedDict()
        embeddings["item_id"] = self.embeddings["item_id"](x["item_id"])
        auxiliary_loss = []
        for name, pooling in self._attention_poolings.items():
            pos_hist = self.embeddings["item_id"](x["hist_item_id"])
            neg_hist = self.embeddings["item_id"](x["neg_hist_item_id"])
            embeddings[name], tmp_loss = pooling(embeddings["item_id"], pos_hist, neg_hist)
            auxiliary_loss.append(tmp_loss)
        emb_concat = torch.cat(list(embeddings.values()), dim=-1)
        output = torch.sigmoid(self.final_layer(self.mlp(emb_concat)))
        return output, torch.mean(torch.tensor(auxiliary_loss))  # BUG


class Clicks(Dataset):
    """Users browse items of one category (item_id % 5); they click a candidate of that category."""

    def __init__(self, n=512):
        g = torch.Generator().manual_seed(0)
        cat = torch.randint(0, 5, (n, 1), generator=g)
        self.hist = cat + 5 * torch.randint(0, 10, (n, T), generator=g)
        self.neg = (cat + 1 + torch.randint(0, 4, (n, 1), generator=g)) % 5 + 5 * torch.randint(0, 10, (n, T), generator=g)
        self.item = torch.randint(0, N_ITEMS, (n,), generator=g)
        self.label = (self.item % 5 == cat[:, 0]).float()

    def __len__(self):
        return len(self.label)

    def __getitem__(self, i):
        return {"item_id": self.item[i], "hist_item_id": self.hist[i], "neg_hist_item_id": self.neg[i],
                "label": self.label[i]}


def fit(epochs, model, loss, optimizer, train_loader, auxiliary_loss_rate=1.0):
    for epoch in range(epochs):
        model.train()
        running_loss = 0
        auxiliary_running_loss = 0
        for index, batch in enumerate(train_loader):
            label = batch["label"]
            optimizer.zero_grad()
            auxiliary_loss = torch.tensor(0.0)
            pred = model(batch)
            if isinstance(pred, tuple):
                pred, auxiliary_loss = pred
                auxiliary_running_loss += (auxiliary_loss.item() - auxiliary_running_loss) / (index + 1)
            loss_t = loss(pred.squeeze(-1), label) + auxiliary_loss_rate * auxiliary_loss
            running_loss += (loss_t.item() - running_loss) / (index + 1)
            loss_t.backward()
            optimizer.step()
        print(f"epoch {epoch} loss {running_loss:.4f} auxiliary loss {auxiliary_running_loss:.4f}")


model = DIEN()
fit(4, model, nn.BCELoss(), torch.optim.Adam(model.parameters(), lr=3e-3), DataLoader(Clicks(), batch_size=64,
                                                                                       shuffle=True))
