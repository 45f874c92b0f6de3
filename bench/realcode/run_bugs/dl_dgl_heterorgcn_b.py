# Source: https://github.com/dmlc/dgl/pull/6636
# Original: dmlc/dgl examples/sampling/graphbolt/rgcn/hetero_rgcn.py (run, create_dataloader)
# Bug: run() calls create_dataloader() at the top of every epoch, so the multi-process loader (GraphBolt's
# MultiProcessDataLoader is a torch DataLoader) and its sampling pipeline are built again and its worker
# processes start over each epoch; the fix builds it once before the epoch loop.
# Here a homogeneous graph with a two-hop mean aggregator stands in for the heterogeneous RGCN.
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

torch.manual_seed(0)
NUM_NODES, FEAT, NUM_CLASSES = 2000, 32, 5


class SeedSet(Dataset):
    def __init__(self, seeds):
        self.seeds = seeds

    def __len__(self):
        return len(self.seeds)

    def __getitem__(self, i):
        return self.seeds[i]


class NeighborSampler:
    def __init__(self, graph, features, labels, fanouts):
        self.indptr, self.indices = graph
        self.features, self.labels, self.fanouts = features, labels, fanouts

    def sample(self, nodes, fanout):
        starts, ends = self.indptr[nodes], self.indptr[nodes + 1]
        offsets = (torch.rand(len(nodes), fanout) * (ends - starts).unsqueeze(1)).long()
        return self.indices[starts.unsqueeze(1) + offsets]

    def __call__(self, seeds):
        seeds = torch.stack(seeds)
        hop1 = self.sample(seeds, self.fanouts[0])
        hop2 = self.sample(hop1.flatten(), self.fanouts[1]).view(len(seeds), self.fanouts[0], -1)
        return self.features[seeds], self.features[hop1], self.features[hop2], self.labels[seeds]


def create_dataloader(graph, features, labels, item_set, batch_size, fanouts, shuffle, num_workers):
    sampler = NeighborSampler(graph, features, labels, fanouts)
    return DataLoader(SeedSet(item_set), batch_size=batch_size, shuffle=shuffle, collate_fn=sampler,
                      num_workers=num_workers)


class TwoHopSAGE(torch.nn.Module):
    def __init__(self, in_feats, hidden, out):
        super().__init__()
        self.layer1 = torch.nn.Linear(2 * in_feats, hidden)
        self.layer2 = torch.nn.Linear(in_feats + hidden, out)

    def forward(self, x0, x1, x2):
        h1 = F.relu(self.layer1(torch.cat([x1, x2.mean(2)], -1)))
        return self.layer2(torch.cat([x0, h1.mean(1)], -1))


def evaluate(model, graph, features, labels, item_set):
    model.eval()
    loader = create_dataloader(graph, features, labels, item_set, 256, [5, 5], shuffle=False, num_workers=0)
    correct = 0
    with torch.no_grad():
        for x0, x1, x2, y in loader:
            correct += (model(x0, x1, x2).argmax(1) == y).sum().item()
    return correct / len(item_set)


def run(graph, features, labels, model, optimizer, train_set, valid_set, num_workers):
    for epoch in range(3):
        model.train()
        total_loss = 0
        data_loader = create_dataloader(  # BUG
            graph, features, labels, train_set, batch_size=64, fanouts=[5, 5], shuffle=True,
            num_workers=num_workers)
        for x0, x1, x2, y in data_loader:
            optimizer.zero_grad()
            logits = model(x0, x1, x2)
            loss = F.nll_loss(logits.log_softmax(dim=-1), y)
            loss.backward()
            optimizer.step()
            total_loss += loss.item() * len(y)
        valid_acc = evaluate(model, graph, features, labels, valid_set)
        print(f"epoch {epoch:02d} loss {total_loss / len(train_set):.4f} valid acc {valid_acc:.3f}")


if __name__ == "__main__":
    degrees = torch.randint(3, 12, (NUM_NODES,))
    indptr = torch.cat([torch.zeros(1, dtype=torch.long), degrees.cumsum(0)])
    indices = torch.randint(0, NUM_NODES, (int(indptr[-1]),))
    labels = torch.randint(0, NUM_CLASSES, (NUM_NODES,))
    features = torch.randn(NUM_NODES, FEAT) + F.one_hot(labels, FEAT).float()
    perm = torch.randperm(NUM_NODES)
    model = TwoHopSAGE(FEAT, 64, NUM_CLASSES)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    run((indptr, indices), features, labels, model, optimizer, perm[:1200], perm[1200:1500], num_workers=2)
