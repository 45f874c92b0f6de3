# Source: https://github.com/modelscope/ms-swift/pull/9901 (variant of dd_msswift_muonclip, written by run13c)
# Original: none (a variant): the same family in another shape, an accelerate loop (torchrun, 2 ranks, gloo) with a
# "dead unit" reset of a middle layer done every few steps outside the model's forward; synthetic data
# Bug: the reset decides which hidden units are dead from the rank's own batch activations and re-draws their weights
# from the rank's own random generator, in place; nothing synchronises it, so the middle layer differs between the
# replicas from the first reset on (the first and last layers stay equal).
import torch
from accelerate import Accelerator
from torch import nn
from torch.nn import functional as F


@torch.no_grad()
def reset_dead_units(layer, activations, g, threshold=1e-3):
    dead = activations.abs().mean(0) < threshold
    if dead.any():
        fresh = torch.randn(int(dead.sum()), layer.weight.shape[1], generator=g) * 0.1
        layer.weight[dead] = fresh  # BUG
        layer.bias[dead] = 0.0


accelerator = Accelerator(cpu=True)
torch.manual_seed(0)
m = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2))
o = torch.optim.SGD(m.parameters(), lr=0.1)
m, o = accelerator.prepare(m, o)
g = torch.Generator().manual_seed(1000 + accelerator.process_index)
hidden = {}
inner = accelerator.unwrap_model(m)
inner[3].register_forward_hook(lambda mod, inp, out: hidden.__setitem__("h", out.detach()))
for step in range(40):
    x = torch.randn(16, 16, generator=g)
    y = (x[:, 0] > 0).long()
    loss = F.cross_entropy(m(x), y)
    o.zero_grad()
    accelerator.backward(loss)
    o.step()
    if step % 5 == 4:
        reset_dead_units(inner[2], hidden["h"], g, threshold=0.05)
middle = accelerator.gather(inner[2].weight.detach().clone().unsqueeze(0))
first = accelerator.gather(inner[0].weight.detach().clone().unsqueeze(0))
if accelerator.is_main_process:
    print("loss", round(loss.item(), 4), "max |rank0 - rank1|: middle", (middle[0] - middle[1]).abs().max().item(),
          "first", (first[0] - first[1]).abs().max().item())
