# Source: https://github.com/jdonnelly36/Deformable-ProtoPNet/issues/6 (fixed in jdonnelly36/Deformable-ProtoPNet@e6a7d39)
# Original: jdonnelly36/Deformable-ProtoPNet main.py (the epoch loop's phases) and train_and_test.py (train,
# _train_or_test, warm_only, joint)
# Bug: in each joint epoch the StepLR of the joint optimizer is stepped before train() runs that epoch's
# optimizer steps; at the first joint epoch the joint optimizer has never stepped (torch warns), the first
# learning rate of the schedule is skipped and every decay comes one epoch early.
import torch
import torch.nn.functional as F

torch.manual_seed(0)


class PPNet(torch.nn.Module):
    def __init__(self, num_classes=4, num_prototypes=8, proto_dim=16):
        super().__init__()
        self.features = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
                                            torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU())
        self.add_on_layers = torch.nn.Sequential(torch.nn.Conv2d(32, proto_dim, 1), torch.nn.Sigmoid())
        self.prototype_vectors = torch.nn.Parameter(torch.rand(num_prototypes, proto_dim))
        self.last_layer = torch.nn.Linear(num_prototypes, num_classes, bias=False)

    def forward(self, x):
        z = self.add_on_layers(self.features(x)).flatten(2).transpose(1, 2)
        distances = torch.cdist(z, self.prototype_vectors.unsqueeze(0).expand(len(x), -1, -1)) ** 2
        min_distances = distances.min(dim=1).values
        similarity = torch.log((min_distances + 1) / (min_distances + 1e-4))
        return self.last_layer(similarity), min_distances


def _train_or_test(model, dataloader, optimizer=None, coefs=None, log=print):
    is_train = optimizer is not None
    total_cross_entropy, n_correct, n_examples = 0.0, 0, 0
    for image, label in dataloader:
        with torch.set_grad_enabled(is_train):
            output, min_distances = model(image)
            cross_entropy = F.cross_entropy(output, label)
            cluster_cost = min_distances.min(dim=1).values.mean()
            loss = coefs["crs_ent"] * cross_entropy + coefs["clst"] * cluster_cost
        n_correct += (output.argmax(1) == label).sum().item()
        n_examples += len(label)
        total_cross_entropy += cross_entropy.item()
        if is_train:
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    log(f"\tcross ent: {total_cross_entropy / len(dataloader):.4f}\taccu: {100 * n_correct / n_examples:.1f}%")
    return n_correct / n_examples


def train(model, dataloader, optimizer, coefs=None, log=print):
    model.train()
    return _train_or_test(model, dataloader, optimizer=optimizer, coefs=coefs, log=log)


def test(model, dataloader, coefs=None, log=print):
    model.eval()
    return _train_or_test(model, dataloader, optimizer=None, coefs=coefs, log=log)


def warm_only(model, log=print):
    for p in model.features.parameters():
        p.requires_grad = False
    for p in model.add_on_layers.parameters():
        p.requires_grad = True
    model.prototype_vectors.requires_grad = True
    log("\twarm")


def joint(model, log=print):
    for p in model.parameters():
        p.requires_grad = True
    log("\tjoint")


ppnet = PPNet()
coefs = {"crs_ent": 1, "clst": 0.8}
joint_optimizer = torch.optim.Adam([
    {"params": ppnet.features.parameters(), "lr": 1e-4, "weight_decay": 1e-3},
    {"params": ppnet.add_on_layers.parameters(), "lr": 3e-3, "weight_decay": 1e-3},
    {"params": ppnet.prototype_vectors, "lr": 3e-3},
])
joint_lr_scheduler = torch.optim.lr_scheduler.StepLR(joint_optimizer, step_size=2, gamma=0.2)
warm_optimizer = torch.optim.Adam([
    {"params": ppnet.add_on_layers.parameters(), "lr": 3e-3, "weight_decay": 1e-3},
    {"params": ppnet.prototype_vectors, "lr": 3e-3},
])
centers = torch.randn(4, 3, 1, 1)
train_loader, test_loader = [], []
for loader, n in ((train_loader, 12), (test_loader, 3)):
    for _ in range(n):
        label = torch.randint(0, 4, (16,))
        loader.append((centers[label] + 0.5 * torch.randn(16, 3, 12, 12), label))
num_warm_epochs, num_train_epochs = 2, 7
for epoch in range(num_train_epochs):
    print(f"epoch: \t{epoch}")
    if epoch < num_warm_epochs:
        warm_only(model=ppnet)
        _ = train(model=ppnet, dataloader=train_loader, optimizer=warm_optimizer, coefs=coefs)
    else:
        joint(model=ppnet)
        joint_lr_scheduler.step()  # BUG
        _ = train(model=ppnet, dataloader=train_loader, optimizer=joint_optimizer, coefs=coefs)
    accu = test(model=ppnet, dataloader=test_loader, coefs=coefs)
