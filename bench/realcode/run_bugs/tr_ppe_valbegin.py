# Source: https://github.com/pfnet/pytorch-pfn-extras/issues/688
# Original: pfnet/pytorch-pfn-extras pytorch_pfn_extras/handler/_logic.py (Logic.train_validation_begin /
# train_validation_end) and the evaluator extension that calls them
# Bug: the evaluator's begin callback puts the model in eval mode and the end callback does not restore it;
# train mode is set only at the next epoch's begin, so with an evaluator triggered every few iterations (not
# at epoch ends) the following iterations train in eval mode.
import torch
import torch.nn.functional as F

torch.manual_seed(0)


class Logic:
    def train_epoch_begin(self, models):
        models["main"].train()

    def train_step(self, models, optimizers, batch):
        x, t = batch
        optimizers["main"].zero_grad()
        loss = F.cross_entropy(models["main"](x), t)
        loss.backward()
        optimizers["main"].step()
        return loss

    def train_validation_begin(self, models):
        models["main"].eval()  # BUG

    def train_validation_end(self, models):
        pass


class Evaluator:
    def __init__(self, logic, models, loader):
        self.logic, self.models, self.loader = logic, models, loader

    def run(self):
        self.logic.train_validation_begin(self.models)
        with torch.no_grad():
            correct = sum((self.models["main"](x).argmax(1) == t).sum().item() for x, t in self.loader)
        self.logic.train_validation_end(self.models)
        return correct


class Manager:
    def __init__(self, logic, models, optimizers, extensions):
        self.logic, self.models, self.optimizers, self.extensions = logic, models, optimizers, extensions
        self.iteration = 0

    def run_extensions(self):
        for trigger_every, extension in self.extensions:
            if self.iteration % trigger_every == 0:
                extension.run()

    def fit(self, loader, epochs):
        for epoch in range(epochs):
            self.logic.train_epoch_begin(self.models)
            for batch in loader:
                self.logic.train_step(self.models, self.optimizers, batch)
                self.iteration += 1
                self.run_extensions()


model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.BatchNorm1d(64), torch.nn.ReLU(), torch.nn.Dropout(0.3),
                            torch.nn.Linear(64, 4))
models = {"main": model}
optimizers = {"main": torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)}
train_loader = [(torch.randn(16, 20), torch.randint(0, 4, (16,))) for _ in range(20)]
valid_loader = [(torch.randn(16, 20), torch.randint(0, 4, (16,))) for _ in range(2)]
logic = Logic()
manager = Manager(logic, models, optimizers, [(6, Evaluator(logic, models, valid_loader))])
manager.fit(train_loader, epochs=3)
print("done")
