# Source: https://github.com/NVIDIA-Merlin/NVTabular/pull/815
# Original: NVIDIA-Merlin/NVTabular nvtabular/framework_utils/torch/utils.py (process_epoch)
# Bug: process_epoch(amp=True by default) runs forward and loss under float16 autocast, then
# loss.backward() and optimizer.step() with no GradScaler (NaN/underflow reported in the PR).
import torch

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"


def process_epoch(dataloader, model, train=False, optimizer=None, loss_func=torch.nn.MSELoss(), amp=True):
    model.train(mode=train)
    with torch.set_grad_enabled(train):
        for x_cat, x_cont, y in dataloader:
            with torch.autocast(device, dtype=torch.float16, enabled=amp):
                y_pred = model(torch.cat([x_cat.float(), x_cont], 1))
                loss = loss_func(y_pred.float(), y)
            if train:
                optimizer.zero_grad()
                loss.backward()  # BUG
                optimizer.step()


model = torch.nn.Sequential(torch.nn.Linear(8, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
train_loader = [(torch.randint(0, 5, (64, 3)), torch.randn(64, 5), torch.randn(64, 1)) for _ in range(20)]
for epoch in range(2):
    process_epoch(train_loader, model, train=True, optimizer=optimizer)
print("done")
