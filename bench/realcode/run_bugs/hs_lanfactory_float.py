# Source: https://github.com/lnccbrown/LANfactory/pull/120
# Original: lnccbrown/LANfactory src/lanfactory/trainers/torch_mlp.py (ModelTrainerTorchMLP.train_and_evaluate)
# Bug: epoch_loss_sum += float(loss) every step blocks on the GPU each batch; the fix keeps a detached
# device tensor and reads it once per epoch.
import torch
import torch.nn.functional as F

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
model = torch.nn.Sequential(torch.nn.Linear(6, 100), torch.nn.Tanh(), torch.nn.Linear(100, 100), torch.nn.Tanh(),
                            torch.nn.Linear(100, 1)).to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
train_dl = [(torch.randn(64, 6), torch.randn(64, 1)) for _ in range(40)]

for epoch in range(2):
    model.train()
    epoch_loss_sum = 0.0
    for xb, yb in train_dl:
        xb, yb = xb.to(device), yb.to(device)
        pred = model(xb)
        loss = F.huber_loss(pred, yb)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        epoch_loss_sum += float(loss)  # BUG
    print("epoch", epoch, epoch_loss_sum / len(train_dl))
