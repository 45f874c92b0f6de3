# Source: https://github.com/gitabcworld/MatchingNetworks/issues/5
# Original: gitabcworld/MatchingNetworks models/AttentionalClassify.py and models/MatchingNetwork.py
# Bug: AttentionalClassify applies softmax to the similarities and weights the support labels with it (a
# probability per class), and MatchingNetwork then feeds those probabilities to F.cross_entropy.
import torch
import torch.nn.functional as F

torch.manual_seed(0)


class AttentionalClassify(torch.nn.Module):
    def forward(self, similarities, support_set_y):
        softmax_similarities = F.softmax(similarities, dim=1)  # BUG
        preds = softmax_similarities.unsqueeze(1).bmm(support_set_y).squeeze()
        return preds


class MatchingNetwork(torch.nn.Module):
    def __init__(self, n_classes=5):
        super().__init__()
        self.g = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32))
        self.classify = AttentionalClassify()
        self.n_classes = n_classes

    def forward(self, support_x, support_y, target_x, target_y):
        support = F.normalize(self.g(support_x), dim=-1)
        target = F.normalize(self.g(target_x), dim=-1)
        similarities = (support @ target.unsqueeze(-1)).squeeze(-1)
        one_hot = F.one_hot(support_y, self.n_classes).float()
        preds = self.classify(similarities, one_hot)
        loss = F.cross_entropy(preds, target_y)
        return loss


net = MatchingNetwork()
optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
for step in range(30):
    support_x = torch.randn(8, 10, 16)
    support_y = torch.randint(0, 5, (8, 10))
    target_x = torch.randn(8, 16)
    target_y = support_y[:, 0]
    loss = net(support_x, support_y, target_x, target_y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("done")
