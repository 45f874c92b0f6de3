# Source: https://github.com/neuroailab/ptutils/issues/22 (fixed in 15899454251b06f26f57c214ef09f5af0cd8e29a)
# Original: neuroailab/ptutils ptutils/runner.py (Runner.train, Runner.test, setup_eval/setup_train), read at 002b036
# Bug: Runner.train puts the model in train mode once, before its loop; every val_freq steps it calls
# Runner.test, whose setup_eval() switches the model to eval mode, and nothing switches it back: after the first
# validation the rest of training runs with dropout off and batch norm frozen on its running statistics.
import torch
import torch.nn.functional as F

torch.manual_seed(0)


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.BatchNorm1d(64), torch.nn.ReLU(),
                                       torch.nn.Dropout(0.3), torch.nn.Linear(64, 4))
        self.optimizer = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)

    def forward(self, data):
        return self.net(data)

    def step(self, data):
        inputs, targets = data
        self.optimizer.zero_grad()
        loss = F.cross_entropy(self(inputs), targets)
        loss.backward()
        self.optimizer.step()
        return {"loss": loss}


class DataProvider:
    def __init__(self):
        self.weights = torch.randn(20, 4)

    def provide(self, prev_output, mode="train"):
        inputs = torch.randn(32, 20)
        return inputs, (inputs @ self.weights).argmax(1)


class MemoryDB:
    def __init__(self):
        self.records = []

    def save(self, record):
        self.records.append(record)


class Runner:
    def __init__(self, model, dataprovider, dbinterface, train_params, save_params, validation_params):
        self.model, self.dataprovider, self.dbinterface = model, dataprovider, dbinterface
        self.train_params, self.save_params, self.validation_params = train_params, save_params, validation_params
        self.global_step = 0

    def setup_eval(self):
        self.model.eval()

    def setup_train(self):
        self.model.train()

    def step(self, prev_output):
        data = self.dataprovider.provide(prev_output, mode="train")
        output = self.model.step(data)
        self.global_step += 1
        return output

    def train(self):
        model_output = None
        self.setup_train()
        for step in range(self.global_step, self.train_params["num_steps"]):
            model_output = self.step(model_output)
            if self.global_step % self.save_params["metric_freq"] == 0:
                self.dbinterface.save({"step": self.global_step, "loss": model_output["loss"].item()})
                print("step", self.global_step, "loss", model_output["loss"].item())
            if self.validation_params and self.global_step % self.save_params["val_freq"] == 0:
                self.test()  # BUG

    def predict(self, prev_output=None):
        data = self.dataprovider.provide(prev_output, mode="test")[0]
        with torch.no_grad():
            return self.model(data)

    def test(self):
        self.setup_eval()
        model_output = None
        all_model_outputs = []
        for step in range(self.validation_params["num_steps"]):
            model_output = self.predict(model_output)
            all_model_outputs.append(model_output)
        self.dbinterface.save({"step": self.global_step, "test_output": all_model_outputs})


runner = Runner(Model(), DataProvider(), MemoryDB(), train_params={"num_steps": 120},
                save_params={"metric_freq": 20, "val_freq": 25}, validation_params={"num_steps": 3})
runner.train()
print("model.training at the end:", runner.model.training)
