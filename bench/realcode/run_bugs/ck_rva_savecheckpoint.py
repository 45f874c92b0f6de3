# Source: https://github.com/kevinzakka/recurrent-visual-attention/issues/8
# Original: kevinzakka/recurrent-visual-attention trainer.py (Trainer.train / Trainer.save_checkpoint)
# Bug: the checkpoint the trainer writes every epoch holds the model weights, the epoch and the best accuracy,
# but not the optimizer's state; the SGD momentum buffers are lost on resume (the maintainer agreed and
# added the optimizer state).
import os
import shutil
import tempfile

import torch
import torch.nn.functional as F

torch.manual_seed(0)


class Trainer:
    def __init__(self, ckpt_dir):
        self.model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=3e-3, momentum=0.9)
        self.ckpt_dir = ckpt_dir
        self.best_valid_acc = 0.0
        self.train_data = [(torch.randn(16, 64), torch.randint(0, 10, (16,))) for _ in range(10)]
        self.valid_data = [(torch.randn(16, 64), torch.randint(0, 10, (16,))) for _ in range(2)]

    def train_one_epoch(self):
        self.model.train()
        for x, y in self.train_data:
            loss = F.cross_entropy(self.model(x), y)
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()

    def validate(self):
        self.model.eval()
        with torch.no_grad():
            hits = sum((self.model(x).argmax(1) == y).sum().item() for x, y in self.valid_data)
        return hits / (16 * len(self.valid_data))

    def train(self, epochs):
        for epoch in range(epochs):
            self.train_one_epoch()
            valid_acc = self.validate()
            is_best = valid_acc > self.best_valid_acc
            self.best_valid_acc = max(valid_acc, self.best_valid_acc)
            self.save_checkpoint({"epoch": epoch + 1, "model_state": self.model.state_dict(),
                                  "best_valid_acc": self.best_valid_acc}, is_best)

    def save_checkpoint(self, state, is_best):
        ckpt_path = os.path.join(self.ckpt_dir, "ram_6_8x8_1_ckpt.pth.tar")
        torch.save(state, ckpt_path)  # BUG
        if is_best:
            shutil.copyfile(ckpt_path, os.path.join(self.ckpt_dir, "ram_6_8x8_1_model_best.pth.tar"))


Trainer(tempfile.mkdtemp()).train(epochs=4)
print("done")
