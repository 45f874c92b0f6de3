# Source: https://github.com/NVlabs/PALAVRA/issues/4
# Original: NVlabs/PALAVRA get_f_theta.py (run_epoch, main's epoch loop)
# Bug: run_epoch ends with scheduler.step() whatever its is_train flag, and main calls it for the
# training epoch and again for the test epoch: the epoch-sized StepLR is stepped twice per epoch, so
# the learning rate decays at twice the planned rate.
import torch
import torch.nn.functional as F
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
emb_dim, set_size = 32, 4


class DeepSet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.phi = torch.nn.Sequential(torch.nn.Linear(emb_dim, 64), torch.nn.ReLU(), torch.nn.Dropout(0.1))
        self.rho = torch.nn.Linear(64, emb_dim)

    def forward(self, x):
        return self.rho(self.phi(x).mean(dim=1))


def make_split(n):
    sets = torch.randn(n, set_size, emb_dim)
    return TensorDataset(sets, sets.mean(dim=1) + 0.1 * torch.randn(n, emb_dim))


def run_epoch(epoch, loader, optimizer, scheduler, set_model, is_train):
    total_loss, total_num = 0.0, 0
    for batch_num, (features, target) in enumerate(loader):
        optimizer.zero_grad()
        out = F.normalize(set_model(features), dim=-1)
        loss = 1 - (out * F.normalize(target, dim=-1)).sum(-1).mean()
        total_num += features.size(0)
        total_loss += loss.item() * features.size(0)
        if is_train:
            loss.backward()
            optimizer.step()
    phase = "train" if is_train else "test "
    print(f"ep {epoch} {phase} loss {total_loss / total_num:.5f} lr {optimizer.param_groups[0]['lr']:.2e}")
    scheduler.step()  # BUG


def main():
    epochs = 12
    train_dataloader = DataLoader(make_split(256), batch_size=32, shuffle=True)
    test_dataloader = DataLoader(make_split(64), batch_size=32, shuffle=True)
    set_model = DeepSet()
    optimizer = torch.optim.Adam(set_model.parameters(), lr=1e-3)
    scheduler = StepLR(optimizer, step_size=4, gamma=0.2)  # decay every 4 epochs
    for epoch in range(epochs):
        set_model.train()
        run_epoch(epoch, train_dataloader, optimizer, scheduler, set_model, is_train=True)
        with torch.no_grad():
            set_model.eval()
            run_epoch(epoch, test_dataloader, optimizer, scheduler, set_model, is_train=False)


if __name__ == "__main__":
    main()
