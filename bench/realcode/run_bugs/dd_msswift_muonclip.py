# Source: https://github.com/modelscope/ms-swift/pull/9901
# Original: modelscope/ms-swift swift/optimizers/muonclip.py (_MaxLogitsTracker, MuonClip.step's QK clipping) as the
# PR describes them; the Muon update is replaced by AdamW's (the clipping is what matters), the model is a one-layer
# attention classifier trained with DDP on synthetic token batches
# Bug: the attention layer records the largest attention logit of the rank's own batch, and the optimizer's QK-clip
# scales the query and key weights in place by sqrt(tau / max_logit) from that process-local value; the ranks see
# different batches, so they scale by different factors after DDP synchronised the gradients and the replicas
# diverge at the first clipped step (the fix all-reduces the max logit first).
import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


class _MaxLogitsTracker:
    def __init__(self):
        self.max_logit = None

    def update(self, logits):
        value = logits.detach().max().item()
        self.max_logit = value if self.max_logit is None else max(self.max_logit, value)

    def pop(self):
        value, self.max_logit = self.max_logit, None
        return value


class Attention(nn.Module):
    def __init__(self, dim, tracker):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.tracker = tracker

    def forward(self, x):
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        logits = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
        self.tracker.update(logits)
        return F.softmax(logits, dim=-1) @ v


class Classifier(nn.Module):
    def __init__(self, tracker, vocab=64, dim=32, n_classes=4):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.attn = Attention(dim, tracker)
        self.head = nn.Linear(dim, n_classes)

    def forward(self, tokens):
        return self.head(self.attn(self.embed(tokens)).mean(1))


class MuonClip(torch.optim.AdamW):
    def __init__(self, params, qk_params, tracker, qk_clip_tau=1.5, **kwargs):
        super().__init__(params, **kwargs)
        self.qk_params, self.tracker, self.qk_clip_tau = qk_params, tracker, qk_clip_tau

    @torch.no_grad()
    def step(self, closure=None):
        loss = super().step(closure)
        max_logit = self.tracker.pop()
        if max_logit is not None and max_logit > self.qk_clip_tau:
            scale = (self.qk_clip_tau / max_logit) ** 0.5  # BUG
            for p in self.qk_params:
                p.mul_(scale)
        return loss


dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
tracker = _MaxLogitsTracker()
model = Classifier(tracker)
qk = [model.attn.q_proj.weight, model.attn.k_proj.weight]
optimizer = MuonClip(model.parameters(), qk, tracker, lr=3e-3, weight_decay=0.0)
ddp_model = DDP(model)
g = torch.Generator().manual_seed(rank)
for step in range(30):
    tokens = torch.randint(0, 64, (8, 12), generator=g)
    labels = tokens[:, 0] % 4
    loss = F.cross_entropy(ddp_model(tokens), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
weight = model.attn.q_proj.weight.detach().clone()
gathered = [torch.zeros_like(weight) for _ in range(dist.get_world_size())]
dist.all_gather(gathered, weight)
if rank == 0:
    print("loss", round(loss.item(), 4), "max |rank0 - rank1| of q_proj", (gathered[0] - gathered[1]).abs().max().item())
dist.destroy_process_group()
