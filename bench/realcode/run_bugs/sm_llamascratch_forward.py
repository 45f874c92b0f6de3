# Source: https://github.com/bkitano/llama-from-scratch/issues/5
# Original: bkitano/llama-from-scratch llama.ipynb (SimpleBrokenModel.forward and the later models)
# Bug: forward turns the last layer's scores into probabilities with F.softmax and then passes those to
# F.cross_entropy, which applies log_softmax again.
import torch
import torch.nn.functional as F
from torch import nn

torch.manual_seed(0)
config = {"vocab_size": 40, "d_model": 32, "context_window": 8, "batch_size": 16}


class SimpleModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.embedding = nn.Embedding(config["vocab_size"], config["d_model"])
        self.linear = nn.Sequential(nn.Linear(config["d_model"], config["d_model"]), nn.ReLU(),
                                    nn.Linear(config["d_model"], config["vocab_size"]))

    def forward(self, idx, targets=None):
        x = self.embedding(idx)
        a = self.linear(x)
        logits = F.softmax(a, dim=-1)  # BUG
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, self.config["vocab_size"]), targets.view(-1))
            return logits, loss
        return logits


data = torch.randint(0, config["vocab_size"], (2000,))


def get_batches():
    ix = torch.randint(0, data.size(0) - config["context_window"] - 1, (config["batch_size"],))
    x = torch.stack([data[i:i + config["context_window"]] for i in ix])
    y = torch.stack([data[i + 1:i + config["context_window"] + 1] for i in ix])
    return x, y


model = SimpleModel(config)
optimizer = torch.optim.Adam(model.parameters())
for epoch in range(60):
    optimizer.zero_grad()
    xs, ys = get_batches()
    logits, loss = model(xs, targets=ys)
    loss.backward()
    optimizer.step()
print("done", loss.item())
