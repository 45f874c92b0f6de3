# Source: https://github.com/BatsResearch/taglets/pull/28
# Original: BatsResearch/taglets taglets/pipeline/trainable.py (Trainable._do_train, Trainable._train_epoch)
# Bug: the training DistributedSampler is built once and never told the epoch (no set_epoch), so every epoch
# each rank sees its shard in exactly the same order; the fix calls train_sampler.set_epoch(epoch) at the top
# of the epoch loop. Launched with torchrun here (the original spawns the workers with mp.spawn).
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

torch.manual_seed(0)


class Trainable:
    def __init__(self, model, batch_size=16, num_epochs=4):
        self.model, self.batch_size, self.num_epochs = model, batch_size, num_epochs
        self.criterion = torch.nn.CrossEntropyLoss()
        self.optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        self.lr_scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=2, gamma=0.5)

    def _do_train(self, rank, train_data, val_data, n_proc):
        dist.init_process_group(backend="gloo", world_size=n_proc, rank=rank)
        self.model = torch.nn.parallel.DistributedDataParallel(self.model.cpu(), device_ids=None)
        train_sampler = DistributedSampler(train_data, num_replicas=n_proc, rank=rank)
        train_data_loader = DataLoader(dataset=train_data, batch_size=self.batch_size, shuffle=False,
                                       num_workers=0, sampler=train_sampler)
        val_sampler = DistributedSampler(val_data, num_replicas=n_proc, rank=rank)
        val_data_loader = DataLoader(dataset=val_data, batch_size=self.batch_size, shuffle=False,
                                     num_workers=0, sampler=val_sampler)
        for epoch in range(self.num_epochs):
            train_loss, train_acc = self._train_epoch(train_data_loader)
            val_loss, val_acc = self._validate_epoch(val_data_loader)
            summaries = torch.tensor([train_loss, train_acc, val_loss, val_acc])
            dist.reduce(summaries, 0, op=dist.ReduceOp.SUM)
            if rank == 0:
                print("epoch", epoch + 1, "train loss {:.4f} acc {:.4f} val loss {:.4f} acc {:.4f}".format(*summaries))
            if self.lr_scheduler:
                self.lr_scheduler.step()
        dist.destroy_process_group()

    def _train_epoch(self, train_data_loader):
        self.model.train()
        running_loss, running_acc = 0, 0
        for batch_idx, batch in enumerate(train_data_loader):  # BUG
            inputs, labels = batch
            self.optimizer.zero_grad()
            outputs = self.model(inputs)
            loss = self.criterion(outputs, labels)
            loss.backward()
            self.optimizer.step()
            running_loss += loss.item()
            running_acc += (outputs.argmax(1) == labels).sum()
        return running_loss / len(train_data_loader.dataset), running_acc.item() / len(train_data_loader.dataset)

    def _validate_epoch(self, val_data_loader):
        self.model.eval()
        running_loss, running_acc = 0, 0
        with torch.no_grad():
            for inputs, labels in val_data_loader:
                outputs = self.model(inputs)
                running_loss += self.criterion(outputs, labels).item()
                running_acc += (outputs.argmax(1) == labels).sum().item()
        return running_loss / len(val_data_loader.dataset), running_acc / len(val_data_loader.dataset)


if __name__ == "__main__":
    import os

    g = torch.Generator().manual_seed(1)
    x = torch.randn(512, 24, generator=g)
    y = (x[:, :4].argmax(1) + (x[:, 4] > 1).long()) % 4
    train_data, val_data = TensorDataset(x[:448], y[:448]), TensorDataset(x[448:], y[448:])
    model = torch.nn.Sequential(torch.nn.Linear(24, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    Trainable(model)._do_train(int(os.environ["RANK"]), train_data, val_data, int(os.environ["WORLD_SIZE"]))
