# Source: https://github.com/NTMC-Community/MatchZoo-py/pull/69
# Original: NTMC-Community/MatchZoo-py matchzoo/losses/rank_cross_entropy_loss.py (RankCrossEntropyLoss)
# Bug: torch.log(F.softmax(logits)) underflows to log(0) = -inf and gives NaN losses; the fix adds an eps
# (log_softmax would be the stable form).
import torch
import torch.nn.functional as F

torch.manual_seed(0)
num_neg = 3


class RankCrossEntropyLoss(torch.nn.Module):
    def forward(self, y_pred, y_true):
        logits = y_pred[::(num_neg + 1), :]
        labels = y_true[::(num_neg + 1), :]
        for neg_idx in range(num_neg):
            logits = torch.cat((logits, y_pred[(neg_idx + 1)::(num_neg + 1), :]), dim=-1)
            labels = torch.cat((labels, y_true[(neg_idx + 1)::(num_neg + 1), :]), dim=-1)
        return -torch.mean(torch.sum(labels * torch.log(F.softmax(logits, dim=-1)), dim=-1))  # BUG


ranker = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
optimizer = torch.optim.Adam(ranker.parameters(), lr=1e-3)
loss_fn = RankCrossEntropyLoss()
for step in range(60):
    pairs = torch.randn(8 * (num_neg + 1), 20) * 400
    y_true = torch.zeros(8 * (num_neg + 1), 1)
    y_true[::num_neg + 1] = 1.0
    optimizer.zero_grad()
    loss = loss_fn(ranker(pairs), y_true)
    loss.backward()
    optimizer.step()
print("loss", loss.item())
