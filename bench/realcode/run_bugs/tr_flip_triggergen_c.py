# Source: https://github.com/KaiyuanZh/FLIP/issues/6
# Original: KaiyuanZh/FLIP invert_CIFAR.py (Trigger.generate, trigger_fast_train), read at b3fd729
# Bug: trigger_fast_train() puts the client model in train mode once, then, inside its batch loop, calls
# Trigger.generate(), which sets self.model.eval() to invert a trigger and returns without switching back; the
# hardening steps that follow (optimizer.step() on the stamped batch) all run with BatchNorm in eval mode (running
# statistics frozen) and dropout off. The maintainer fixed it by adding self.model.train() before generate() returns.
# Our small CNN, 3x8x8 synthetic images, a short trigger search; the warmup branch of the loop is kept.
import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
np.random.seed(0)
NUM_CLASSES = 10


class Trigger:
    def __init__(self, model, steps=5, attack_succ_threshold=0.85, num_classes=NUM_CLASSES):
        self.model = model
        self.steps = steps
        self.attack_succ_threshold = attack_succ_threshold
        self.num_classes = num_classes
        self.epsilon = 1e-7
        self.img_channels, self.img_rows, self.img_cols = 3, 8, 8

    def generate(self, pair, x_set, y_set, steps=5, init_cost=1e-3, learning_rate=0.1):
        self.model.eval()
        source, target = pair
        init_mask = np.arctanh((np.random.random((self.img_rows, self.img_cols)) * 0.1 - 0.5) * (2 - self.epsilon))
        init_pattern = np.arctanh((np.random.random((3, self.img_rows, self.img_cols)) - 0.5) * (2 - self.epsilon))
        self.mask_tensor = torch.tensor(init_mask, dtype=torch.float32, requires_grad=True)
        self.pattern_tensor = torch.tensor(init_pattern, dtype=torch.float32, requires_grad=True)
        criterion = torch.nn.CrossEntropyLoss(reduction="none")
        optimizer = torch.optim.Adam([self.mask_tensor, self.pattern_tensor], lr=learning_rate, betas=(0.5, 0.9))
        for step in range(steps):
            mask = (torch.tanh(self.mask_tensor) / (2 - self.epsilon) + 0.5).repeat(self.img_channels, 1, 1)
            pattern = torch.tanh(self.pattern_tensor) / (2 - self.epsilon) + 0.5
            x_adv = (1 - mask) * x_set + mask * pattern
            optimizer.zero_grad()
            loss_ce = criterion(self.model(x_adv), y_set)
            loss = loss_ce.mean() + torch.sum(torch.abs(mask)) / self.img_channels * init_cost
            loss.backward()
            optimizer.step()
        speed = loss_ce.detach().numpy()
        return mask.detach(), pattern.detach(), speed


def trigger_fast_train(model, x_train, y_train, epochs=3):
    model.train()
    my_dataloader = DataLoader(TensorDataset(x_train, y_train), batch_size=64, shuffle=True)
    criterion = torch.nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.001, betas=(0.5, 0.9))
    x_extra, y_extra = x_train[:50], y_train[:50]
    portion, warmup_steps, target, step = 0.9, 1, -1, 0
    max_warmup_steps = warmup_steps * NUM_CLASSES
    for epoch in range(epochs):
        for x_batch, y_batch in my_dataloader:
            x_adv = x_batch.clone()
            warmup = step < max_warmup_steps
            if warmup:
                target = (target + 1) % NUM_CLASSES
                trigger = Trigger(model, steps=5)
                indices = (y_extra != target).nonzero()[:, 0]
                mask, pattern, speed = trigger.generate((None, target), x_extra[indices],  # BUG
                                                        torch.full((len(indices),), target))
                choice = (y_batch != target).nonzero()[:, 0]
                choice = choice[: int(len(choice) * portion)]
                x_adv[choice] = torch.clip((1 - mask) * x_batch[choice] + mask * pattern, 0.0, 1.0)
            optimizer.zero_grad()
            loss = criterion(model(x_adv), y_batch)
            loss.backward()
            optimizer.step()
            step += 1
        print(f"epoch {epoch} loss {loss.item():.4f}")


model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.Dropout(0.3),
                      nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, NUM_CLASSES))
x_train = torch.rand(640, 3, 8, 8)
y_train = (x_train.mean((2, 3)) @ torch.randn(3, NUM_CLASSES)).argmax(1)
trigger_fast_train(model, x_train, y_train)
