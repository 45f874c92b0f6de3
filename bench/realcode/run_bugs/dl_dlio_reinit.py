# Source: https://github.com/argonne-lcf/dlio_benchmark/pull/143
# Original: argonne-lcf/dlio_benchmark dlio_benchmark/main.py (DLIOBenchmark.run / _train) and
# data_loader/torch_data_loader.py
# Bug: the framework's data loader (a new torch DataLoader with its worker pool) is re-initialised at the
# start of every epoch instead of once.
import torch
from torch.utils.data import DataLoader, Dataset

torch.manual_seed(0)


class TorchDataset(Dataset):
    def __len__(self):
        return 96

    def __getitem__(self, i):
        return torch.full((32,), float(i % 7))


class TorchDataLoader:
    def __init__(self, batch_size):
        self.batch_size = batch_size
        self._loader = None

    def read(self):
        self._loader = DataLoader(TorchDataset(), batch_size=self.batch_size, num_workers=2,
                                  persistent_workers=False)

    def next(self):
        yield from self._loader


class DLIOBenchmark:
    def __init__(self, epochs=4):
        self.epochs = epochs
        self.model = torch.nn.Linear(32, 1)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=1e-3)
        self.loader = TorchDataLoader(batch_size=8)

    def _train(self, epoch):
        steps = 0
        for batch in self.loader.next():
            loss = self.model(batch).pow(2).mean()
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            steps += 1
        return steps

    def run(self):
        for epoch in range(1, self.epochs + 1):
            self.loader.read()  # BUG
            print("epoch", epoch, "steps", self._train(epoch))


if __name__ == "__main__":
    DLIOBenchmark().run()
