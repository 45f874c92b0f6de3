# Source: https://github.com/nishnik/Deep-Semantic-Similarity-Model-PyTorch/issues/2
# Original: nishnik/Deep-Semantic-Similarity-Model-PyTorch cdssm.py (CDSSM.forward and the training loop)
# Bug: the model's forward ends with a softmax over the gamma-scaled query/document similarities and returns
# probabilities, which the loop hands to CrossEntropyLoss as if they were logits (softmax applied twice).
import torch
import torch.nn.functional as F

torch.manual_seed(0)
WORD_DEPTH = 120
K, L, J = 48, 32, 4


def kmax_pooling(x, dim, k):
    index = x.topk(k, dim=dim)[1].sort(dim=dim)[0]
    return x.gather(dim, index)


class CDSSM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.query_conv = torch.nn.Conv1d(WORD_DEPTH, K, 1)
        self.query_sem = torch.nn.Linear(K, L)
        self.doc_conv = torch.nn.Conv1d(WORD_DEPTH, K, 1)
        self.doc_sem = torch.nn.Linear(K, L)
        self.learn_gamma = torch.nn.Conv1d(1, 1, 1)

    def semantic(self, conv, sem, x):
        h = torch.tanh(conv(x.transpose(1, 2)))
        h = kmax_pooling(h, 2, 1).transpose(1, 2)
        return torch.tanh(sem(h)).reshape(L)

    def forward(self, q, pos, negs):
        q_s = self.semantic(self.query_conv, self.query_sem, q)
        doc_ss = [self.semantic(self.doc_conv, self.doc_sem, d) for d in [pos] + negs]
        dots = torch.stack([q_s.dot(d_s) for d_s in doc_ss])
        with_gamma = self.learn_gamma(dots.reshape(J + 1, 1, 1))
        prob = F.softmax(with_gamma, dim=0)  # BUG
        return prob


sample_size = 40
queries = [torch.rand(1, int(torch.randint(1, 10, ())), WORD_DEPTH) for _ in range(sample_size)]
docs = [torch.rand(1, int(torch.randint(20, 60, ())), WORD_DEPTH) for _ in range(sample_size)]
negatives = [torch.randperm(sample_size - 1)[:J] for _ in range(sample_size)]

model = CDSSM()
criterion = torch.nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
y = torch.zeros(1, dtype=torch.long)
for epoch in range(3):
    for i in range(sample_size):
        negs = [docs[n if n < i else n + 1] for n in negatives[i].tolist()]
        y_pred = model(queries[i], docs[i], negs)
        loss = criterion(y_pred.reshape(1, J + 1), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print("epoch", epoch, "loss", round(loss.item(), 4))
