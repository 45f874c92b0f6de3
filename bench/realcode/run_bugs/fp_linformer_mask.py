# Source: https://github.com/tatp22/linformer-pytorch/pull/19
# Original: tatp22/linformer-pytorch linformer_pytorch/linformer_pytorch.py (LinearAttentionHead.forward)
# Bug: the causal mask is filled with -1e10, which float16 cannot represent (max 65504): mixed-precision
# training breaks in the attention head.
import torch
import torch.nn.functional as F

torch.manual_seed(0)
seq, k, dim = 16, 8, 32


class LinearAttentionHead(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.E = torch.nn.Linear(seq, k)
        self.F = torch.nn.Linear(seq, k)
        self.causal_mask = torch.tril(torch.ones(seq, k)).bool()

    def forward(self, Q, K, V):
        K = self.E(K.transpose(1, 2)).transpose(1, 2)
        P_bar = Q @ K.transpose(1, 2) / dim ** 0.5
        if self.causal_mask is not None:
            P_bar = P_bar.masked_fill_(~self.causal_mask, -1e10)  # BUG
        P_bar = P_bar.softmax(dim=-1)
        V = self.F(V.transpose(1, 2)).transpose(1, 2)
        return P_bar @ V


class Linformer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.to_q, self.to_k, self.to_v = (torch.nn.Linear(dim, dim) for _ in range(3))
        self.head = LinearAttentionHead()
        self.out = torch.nn.Linear(dim, dim)

    def forward(self, x):
        return self.out(self.head(self.to_q(x), self.to_k(x), self.to_v(x)))


model = Linformer()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
scaler = torch.amp.GradScaler("cpu")
for step in range(20):
    x = torch.randn(4, seq, dim)
    optimizer.zero_grad()
    with torch.autocast("cpu", dtype=torch.float16):
        loss = F.mse_loss(model(x).float(), x)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
print("done")
