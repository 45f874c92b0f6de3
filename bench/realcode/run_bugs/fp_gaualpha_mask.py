# Source: https://github.com/JunnYu/GAU-alpha-pytorch/issues/1
# Original: JunnYu/GAU-alpha-pytorch src/gau_alpha/layer.py (GatedAttentionUnit.forward)
# Bug: attention scores are masked with -INF where INF = 1e12 (a module constant), which overflows float16 in
# half-precision training; the fix lowers it to 1e4.
import torch
import torch.nn.functional as F

torch.manual_seed(0)
INF = 1e12
hidden, inter, key = 32, 64, 16


class GatedAttentionUnit(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.i_dense = torch.nn.Linear(hidden, 2 * inter + key)
        self.q_gamma = torch.nn.Parameter(torch.ones(key))
        self.k_gamma = torch.nn.Parameter(torch.ones(key))
        self.o_dense = torch.nn.Linear(inter, hidden)

    def forward(self, hidden_states, attention_mask):
        x = self.i_dense(hidden_states)
        u, v, qk = torch.split(F.silu(x), [inter, inter, key], dim=-1)
        q, k = qk * self.q_gamma, qk * self.k_gamma
        a = torch.einsum("bmd,bnd->bmn", q, k) / key ** 0.5
        a = a.masked_fill(attention_mask[:, None, :] == 0, -INF)  # BUG
        A = torch.softmax(a, dim=-1)
        return self.o_dense(u * torch.einsum("bmn,bnd->bmd", A, v))


model = torch.nn.ModuleDict({"emb": torch.nn.Embedding(100, hidden), "gau": GatedAttentionUnit(),
                             "cls": torch.nn.Linear(hidden, 2)})
optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
scaler = torch.amp.GradScaler("cpu")
for step in range(20):
    input_ids = torch.randint(1, 100, (4, 12))
    input_ids[:, 9:] = 0
    attention_mask = (input_ids != 0).long()
    labels = torch.randint(0, 2, (4,))
    optimizer.zero_grad()
    with torch.autocast("cpu", dtype=torch.float16):
        h = model["gau"](model["emb"](input_ids), attention_mask)
        loss = F.cross_entropy(model["cls"](h[:, 0]).float(), labels)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
print("done")
