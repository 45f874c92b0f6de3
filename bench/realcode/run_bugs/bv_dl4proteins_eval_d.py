# Source: https://github.com/Graylab/DL4Proteins-notebooks/issues/11
# Original: Graylab/DL4Proteins-notebooks WS07 (graph neural network notebook: the evaluation loop)
# Bug: the evaluation loop over the test set still calls loss.backward() and optimizer.step() for 10 epochs;
# model.eval() only changes dropout/batch norm, so the reported test accuracy comes from a model trained on it.
import torch
import torch.nn.functional as F

torch.manual_seed(0)
n_nodes, n_feat, n_classes = 12, 8, 3


class GCN(torch.nn.Module):
    def __init__(self, hidden=32):
        super().__init__()
        self.lin1 = torch.nn.Linear(n_feat, hidden)
        self.lin2 = torch.nn.Linear(hidden, hidden)
        self.drop = torch.nn.Dropout(0.2)
        self.out = torch.nn.Linear(hidden, n_classes)

    def forward(self, x, adj):
        deg = adj.sum(-1, keepdim=True).clamp(min=1)
        h = F.relu(self.lin1(adj @ x / deg))
        h = F.relu(self.lin2(adj @ self.drop(h) / deg))
        return self.out(h.mean(1))


def make_graphs(n):
    x = torch.randn(n, n_nodes, n_feat)
    adj = (torch.rand(n, n_nodes, n_nodes) > 0.7).float()
    adj = ((adj + adj.transpose(1, 2)) > 0).float()
    y = (x[:, :, 0].mean(1) * 4).long().clamp(-1, 1) + 1
    return [(x[i:i + 16], adj[i:i + 16], y[i:i + 16]) for i in range(0, n, 16)]


train_loader, test_loader = make_graphs(160), make_graphs(64)
model = GCN()
optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
criterion = torch.nn.CrossEntropyLoss()


def train_model(epochs):
    model.train()
    for epoch in range(epochs):
        for x, adj, graph_y in train_loader:
            optimizer.zero_grad()
            loss = criterion(model(x, adj), graph_y)
            loss.backward()
            optimizer.step()


def evaluate(epochs=10):
    model.eval()
    correct = total = 0
    for epoch in range(epochs):
        for x, adj, graph_y in test_loader:
            optimizer.zero_grad()
            output = model(x, adj)
            loss = criterion(output, graph_y)
            loss.backward()  # BUG
            optimizer.step()
            if epoch == epochs - 1:
                correct += int((output.argmax(1) == graph_y).sum())
                total += len(graph_y)
    return correct / total


train_model(10)
print("test accuracy", evaluate())
