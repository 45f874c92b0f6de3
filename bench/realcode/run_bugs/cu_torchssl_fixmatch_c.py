# Source: https://github.com/TorchSSL/TorchSSL/pull/59
# Original: TorchSSL/TorchSSL models/fixmatch/fixmatch.py (FixMatch.train), run with --amp True --clip > 0
# (both off by default in the repo's configs)
# Bug: with mixed precision on, FixMatch.train clips the gradients right after scaler.scale(loss).backward(),
# before scaler.unscale_(): the norm it clips is the loss-scaled one, so every step is shrunk by the loss
# scale (65536 at first) before GradScaler divides by it again.
import math

import torch
import torch.nn.functional as F

torch.manual_seed(0)


class EMA:
    def __init__(self, model, decay):
        self.model, self.decay = model, decay
        self.shadow = {n: p.detach().clone() for n, p in model.named_parameters()}

    def update(self):
        with torch.no_grad():
            for n, p in self.model.named_parameters():
                self.shadow[n].mul_(self.decay).add_(p.detach(), alpha=1 - self.decay)


def consistency_loss(logits_s, logits_w, T, p_cutoff):
    pseudo = torch.softmax(logits_w.detach().float() / T, dim=-1)
    max_probs, max_idx = pseudo.max(dim=-1)
    mask = max_probs.ge(p_cutoff).float()
    return (F.cross_entropy(logits_s.float(), max_idx, reduction="none") * mask).mean(), mask.mean()


class FixMatch:
    def __init__(self, net, num_classes, ema_m, lambda_u, T, p_cutoff):
        self.model = net
        self.num_classes, self.ema_m, self.lambda_u = num_classes, ema_m, lambda_u
        self.T, self.p_cutoff = T, p_cutoff
        self.it = 0

    def set_optimizer(self, optimizer, scheduler):
        self.optimizer, self.scheduler = optimizer, scheduler

    def train(self, args, loader_dict):
        self.model.train()
        self.ema = EMA(self.model, self.ema_m)
        scaler = torch.amp.GradScaler("cpu")
        for (x_lb, y_lb), (x_ulb_w, x_ulb_s) in zip(loader_dict["train_lb"], loader_dict["train_ulb"]):
            if self.it > args["num_train_iter"]:
                break
            num_lb = x_lb.shape[0]
            inputs = torch.cat((x_lb, x_ulb_w, x_ulb_s))
            with torch.autocast("cpu", dtype=torch.float16, enabled=args["amp"]):
                logits = self.model(inputs)
                logits_x_lb = logits[:num_lb]
                logits_x_ulb_w, logits_x_ulb_s = logits[num_lb:].chunk(2)
                sup_loss = F.cross_entropy(logits_x_lb.float(), y_lb)
                unsup_loss, mask = consistency_loss(logits_x_ulb_s, logits_x_ulb_w, self.T, self.p_cutoff)
                total_loss = sup_loss + self.lambda_u * unsup_loss
            if args["amp"]:
                scaler.scale(total_loss).backward()
                if args["clip"] > 0:
                    torch.nn.utils.clip_grad_norm_(self.model.parameters(), args["clip"])  # BUG
                scaler.step(self.optimizer)
                scaler.update()
            else:
                total_loss.backward()
                if args["clip"] > 0:
                    torch.nn.utils.clip_grad_norm_(self.model.parameters(), args["clip"])
                self.optimizer.step()
            self.scheduler.step()
            self.ema.update()
            self.model.zero_grad()
            if self.it % 20 == 0:
                print(f"it {self.it} sup_loss {sup_loss.item():.4f} unsup_loss {unsup_loss.item():.4f} "
                      f"mask {mask.item():.2f} lr {self.optimizer.param_groups[0]['lr']:.4f}")
            self.it += 1


centers = torch.randn(4, 32) * 2
loader_dict = {"train_lb": [], "train_ulb": []}
for _ in range(60):
    y = torch.randint(0, 4, (8,))
    loader_dict["train_lb"].append((centers[y] + torch.randn(8, 32), y))
    u = centers[torch.randint(0, 4, (24,))]
    loader_dict["train_ulb"].append((u + 0.3 * torch.randn(24, 32), u + torch.randn(24, 32)))
net = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128), torch.nn.ReLU(),
                          torch.nn.Linear(128, 4))
model = FixMatch(net, num_classes=4, ema_m=0.999, lambda_u=1.0, T=1.0, p_cutoff=0.95)
optimizer = torch.optim.SGD(net.parameters(), lr=0.03, momentum=0.9, nesterov=True, weight_decay=5e-4)
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda it: max(0.0, math.cos(7 * math.pi * it / (16 * 60))))
model.set_optimizer(optimizer, scheduler)
model.train({"num_train_iter": 60, "amp": True, "clip": 1.0}, loader_dict)
