# Source: https://github.com/joeynmt/joeynmt/issues/184
# Original: joeynmt/joeynmt joeynmt/training.py (TrainManager.train_and_validate / _validate) and
# joeynmt/prediction.py (predict)
# Bug: validation runs every validation_freq steps inside the epoch; _validate calls predict(), which sets
# model.eval(), and train mode is only set again at the start of the next epoch, so the rest of the epoch
# trains with dropout off.
import torch
import torch.nn.functional as F

torch.manual_seed(0)


def predict(model, data):
    model.eval()
    total = 0.0
    with torch.no_grad():
        for src, trg in data:
            total += F.cross_entropy(model(src).reshape(-1, 40), trg.reshape(-1), reduction="sum").item()
    return total / sum(t.numel() for _, t in data)


class TrainManager:
    def __init__(self, model):
        self.model = model
        self.optimizer = torch.optim.Adam(model.parameters(), lr=2e-4)
        self.validation_freq = 7
        self.steps = 0

    def _train_step(self, src, trg):
        logits = self.model(src)
        batch_loss = F.cross_entropy(logits.reshape(-1, 40), trg.reshape(-1))
        batch_loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.steps += 1
        return batch_loss.item()

    def _validate(self, valid_data):
        valid_loss = predict(self.model, valid_data)
        print(f"step {self.steps}: valid loss {valid_loss:.3f}")

    def train_and_validate(self, train_data, valid_data, epochs):
        for epoch_no in range(epochs):
            self.model.train()
            for src, trg in train_data:
                self._train_step(src, trg)
                if self.steps % self.validation_freq == 0:
                    self._validate(valid_data)  # BUG


model = torch.nn.Sequential(torch.nn.Embedding(40, 32), torch.nn.Dropout(0.2), torch.nn.Linear(32, 32), torch.nn.ReLU(),
                            torch.nn.Dropout(0.2), torch.nn.Linear(32, 40))
train_data = [(torch.randint(0, 40, (8, 10)), torch.randint(0, 40, (8, 10))) for _ in range(20)]
valid_data = [(torch.randint(0, 40, (8, 10)), torch.randint(0, 40, (8, 10))) for _ in range(2)]
TrainManager(model).train_and_validate(train_data, valid_data, epochs=3)
print("done")
