# Source: https://github.com/mit-han-lab/efficientvit/issues/110 (fixed in mit-han-lab/efficientvit@0f5680d)
# Original: mit-han-lab/efficientvit efficientvit/models/nn/ops.py (LiteMLA.relu_linear_att, EfficientViTBlock)
# trained with fp16 autocast and a GradScaler (here without the multi-scale depthwise aggregation and the
# depthwise conv of MBConv: float16 depthwise convolutions are very slow on CPU)
# Bug: relu_linear_att turns autocast off but keeps the float16 qkv it is given, so both matmuls of the
# linear attention run in float16; the products summed over all tokens and channels pass 65504, the
# normaliser divides inf by inf and the block's output is NaN (the result is upcast only after the matmuls).
import torch
import torch.nn.functional as F

torch.manual_seed(0)


def conv_bn_act(cin, cout, k=1, stride=1, groups=1, norm=True, act=True):
    layers = [torch.nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=not norm)]
    if norm:
        layers.append(torch.nn.BatchNorm2d(cout))
    if act:
        layers.append(torch.nn.Hardswish())
    return torch.nn.Sequential(*layers)


class LiteMLA(torch.nn.Module):
    def __init__(self, in_channels, out_channels, dim=32, scales=(), eps=1.0e-15):
        super().__init__()
        self.eps, self.dim = eps, dim
        heads = in_channels // dim
        total_dim = heads * dim
        self.qkv = conv_bn_act(in_channels, 3 * total_dim, norm=False, act=False)
        self.aggreg = torch.nn.ModuleList([
            torch.nn.Sequential(
                torch.nn.Conv2d(3 * total_dim, 3 * total_dim, s, padding=s // 2, groups=3 * total_dim, bias=False),
                torch.nn.Conv2d(3 * total_dim, 3 * total_dim, 1, groups=3 * heads, bias=False))
            for s in scales])
        self.proj = conv_bn_act(total_dim * (1 + len(scales)), out_channels, act=False)

    @torch.autocast("cpu", enabled=False)
    def relu_linear_att(self, qkv):
        B, _, H, W = list(qkv.size())
        qkv = torch.reshape(qkv, (B, -1, 3 * self.dim, H * W))
        q, k, v = qkv[:, :, 0:self.dim], qkv[:, :, self.dim:2 * self.dim], qkv[:, :, 2 * self.dim:]
        q = F.relu(q)
        k = F.relu(k)
        trans_k = k.transpose(-1, -2)
        v = F.pad(v, (0, 0, 0, 1), mode="constant", value=1)
        vk = torch.matmul(v, trans_k)
        out = torch.matmul(vk, q)  # BUG
        if out.dtype in [torch.float16, torch.bfloat16]:
            out = out.float()
        out = out[:, :, :-1] / (out[:, :, -1:] + self.eps)
        return torch.reshape(out, (B, -1, H, W))

    def forward(self, x):
        qkv = self.qkv(x)
        qkv = torch.cat([qkv] + [op(qkv) for op in self.aggreg], dim=1)
        return self.proj(self.relu_linear_att(qkv))


class EfficientViTBlock(torch.nn.Module):
    def __init__(self, channels, dim=32, expand_ratio=2):
        super().__init__()
        self.context_module = LiteMLA(channels, channels, dim=dim)
        mid = channels * expand_ratio
        self.local_module = torch.nn.Sequential(conv_bn_act(channels, mid, norm=False),
                                                conv_bn_act(mid, channels, act=False))

    def forward(self, x):
        x = x + self.context_module(x)
        return x + self.local_module(x)


class TinyEfficientViT(torch.nn.Module):
    def __init__(self, num_classes=10, width=32):
        super().__init__()
        self.stem = conv_bn_act(3, width, 3, stride=2)
        self.stage = torch.nn.Sequential(*[EfficientViTBlock(width) for _ in range(4)])
        self.head = torch.nn.Linear(width, num_classes)

    def forward(self, x):
        return self.head(self.stage(self.stem(x)).mean((2, 3)))


model = TinyEfficientViT()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
scaler = torch.amp.GradScaler("cpu")
for step in range(3):
    images, labels = torch.randn(4, 3, 64, 64), torch.randint(0, 10, (4,))
    with torch.autocast("cpu", dtype=torch.float16):
        loss = F.cross_entropy(model(images), labels)
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    print("step", step, "loss", loss.item(), "scale", scaler.get_scale())
