# Source: https://github.com/intel/e2eAIOK/pull/198 (issue #197)
# Original: intel/e2eAIOK modelzoo/unet/nnunet.patch, nnunet/training/network_training/nnUNetTrainer_DA_V2.py
# (initialize_network, run_iteration) and the domain-adaptation network's compute_loss
# Bug: the network holding the backbone and the adversarial adapter is wrapped in DDP as a whole, but
# run_iteration unwraps it and calls its compute_loss method, which runs both sub-networks directly; the DDP
# forward never runs, no gradient is all-reduced, and each rank trains its own copy.
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)


class GradReverse(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, coeff):
        ctx.coeff = coeff
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return -ctx.coeff * grad, None


class Backbone(torch.nn.Module):
    def __init__(self, num_classes=3):
        super().__init__()
        self.features = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.BatchNorm2d(8),
                                            torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.ReLU())
        self.seg_head = torch.nn.Conv2d(8, num_classes, 1)

    def forward(self, x):
        feats = self.features(x)
        return self.seg_head(feats), feats


class Adapter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.disc = torch.nn.Sequential(torch.nn.Conv2d(8, 8, 3, stride=2), torch.nn.ReLU(),
                                        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 1))

    def forward(self, feats, coeff):
        return self.disc(GradReverse.apply(feats, coeff))


class DomainAdapterNetwork(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = Backbone()
        self.adapter = Adapter()

    def forward(self, x):
        return self.backbone(x)[0]

    def compute_loss(self, data, label, coeff=0.3):
        source_data, target_data = data
        source_output, source_feats = self.backbone(source_data)
        _, target_feats = self.backbone(target_data)
        source_loss = F.cross_entropy(source_output, label)
        domain_logits = torch.cat([self.adapter(source_feats, coeff), self.adapter(target_feats, coeff)])
        domain_label = torch.cat([torch.ones(len(source_data), 1), torch.zeros(len(target_data), 1)])
        adv_loss = F.binary_cross_entropy_with_logits(domain_logits, domain_label)
        return source_loss + adv_loss, adv_loss, source_loss


def get_network(network):
    return network.module if isinstance(network, DDP) else network


class TrainerDA:
    def __init__(self):
        self.network = None
        self.optimizer = None

    def initialize_network(self):
        self.network = DomainAdapterNetwork()
        if dist.is_initialized() and dist.get_world_size() > 1:
            self.network = DDP(self.network, find_unused_parameters=True)
        self.optimizer = torch.optim.SGD(self.network.parameters(), lr=0.01, momentum=0.99, nesterov=True)

    def run_iteration(self, batch):
        source_data, source_label, target_data = batch
        self.optimizer.zero_grad()
        total_loss, adv_loss, source_loss = get_network(self.network).compute_loss(  # BUG
            (source_data, target_data), source_label)
        total_loss.backward()
        torch.nn.utils.clip_grad_norm_(self.network.parameters(), 12)
        self.optimizer.step()
        return {"train/total_loss": total_loss.item(), "train/gan_loss": adv_loss.item()}

    def run_training(self, data_generator, num_batches):
        self.network.train()
        for epoch in range(3):
            for _ in range(num_batches):
                metrics = self.run_iteration(next(data_generator))
            if rank == 0:
                print("epoch", epoch, metrics)


def batches(seed):
    g = torch.Generator().manual_seed(seed)
    while True:
        source = torch.randn(4, 1, 16, 16, generator=g)
        label = (source[:, 0] > 0).long() + (source[:, 0] > 1).long()
        target = 0.5 * torch.randn(4, 1, 16, 16, generator=g) + 0.3
        yield source, label, target


trainer = TrainerDA()
trainer.initialize_network()
trainer.run_training(batches(100 + rank), num_batches=20)
dist.destroy_process_group()
