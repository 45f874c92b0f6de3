# Source: https://github.com/summerlvsong/Aggregation-Cross-Entropy/issues/2
# Original: summerlvsong/Aggregation-Cross-Entropy source/models/seq_module.py (ACE loss)
# Bug: torch.log of the aggregated softmax scores, which are 0 for classes absent from the image, makes the
# loss NaN; the fix adds 1e-10 before the log.
import torch

torch.manual_seed(0)
T, B, C = 12, 4, 10


class ACE(torch.nn.Module):
    def forward(self, logits, label):
        probs = torch.softmax(logits, dim=-1)                  # B x T x C
        agg = probs.sum(1) / T                                 # B x C
        label = label / T
        loss = -torch.sum(torch.log(agg) * label) / B  # BUG
        return loss


encoder = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, C))
optimizer = torch.optim.Adadelta(encoder.parameters(), lr=1.0)
ace = ACE()
for step in range(60):
    feats = torch.randn(B, T, 8) * 300
    counts = torch.zeros(B, C)
    counts[:, 0] = T - 3
    counts[torch.arange(B), torch.randint(1, C, (B,))] += 3
    optimizer.zero_grad()
    loss = ace(encoder(feats), counts)
    loss.backward()
    optimizer.step()
print("loss", loss.item())
