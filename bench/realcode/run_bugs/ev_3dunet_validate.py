# Source: https://github.com/wolny/pytorch-3dunet/issues/53
# Original: wolny/pytorch-3dunet unet3d/trainer.py (UNet3DTrainer.train / validate)
# Bug: validate() runs the validation batches under no_grad but never calls model.eval(), so dropout stays on and
# batch norm normalises with (and updates its running statistics from) the validation batches; the maintainer
# added self.model.eval() before and self.model.train() after the validation.
import torch
import torch.nn.functional as F

torch.manual_seed(0)


class TinyUNet3D(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = torch.nn.Sequential(torch.nn.Conv3d(1, 4, 3, padding=1), torch.nn.BatchNorm3d(4), torch.nn.ReLU())
        self.drop = torch.nn.Dropout3d(0.2)
        self.dec = torch.nn.Conv3d(4, 2, 1)

    def forward(self, x):
        return self.dec(self.drop(self.enc(x)))


class UNet3DTrainer:
    def __init__(self, model, optimizer, loaders, validate_after_iters=5, max_num_iterations=40):
        self.model = model
        self.optimizer = optimizer
        self.loaders = loaders
        self.validate_after_iters = validate_after_iters
        self.max_num_iterations = max_num_iterations
        self.num_iterations = 1
        self.best_eval_score = float("inf")

    def fit(self):
        while self.num_iterations <= self.max_num_iterations:
            self.train()

    def train(self):
        self.model.train()
        for input, target in self.loaders["train"]:
            output = self.model(input)
            loss = F.cross_entropy(output, target)
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            if self.num_iterations % self.validate_after_iters == 0:
                eval_score = self.validate()
                self.best_eval_score = min(self.best_eval_score, eval_score)
            self.num_iterations += 1

    def validate(self):
        losses = []
        with torch.no_grad():
            for input, target in self.loaders["val"]:
                output = self.model(input)  # BUG
                losses.append(F.cross_entropy(output, target).item())
        return sum(losses) / len(losses)


def batches(n):
    return [(torch.randn(2, 1, 8, 8, 8), torch.randint(0, 2, (2, 8, 8, 8))) for _ in range(n)]


model = TinyUNet3D()
trainer = UNet3DTrainer(model, torch.optim.Adam(model.parameters(), lr=1e-3), {"train": batches(10), "val": batches(3)})
trainer.fit()
print("best", round(trainer.best_eval_score, 4))
