# Source: https://github.com/yastrebksv/TennisCourtDetector/issues/7
# Original: yastrebksv/TennisCourtDetector base_trainer.py (train)
# Bug: train() steps the optimizer every batch and never clears the gradients.
import torch

torch.manual_seed(0)


def train(model, train_loader, optimizer, criterion, max_iters=60):
    model.train()
    losses = []
    for iter_id, (inp, gt_hm) in enumerate(train_loader):
        out = model(inp)
        loss = criterion(torch.sigmoid(out), gt_hm)
        loss.backward()  # BUG
        optimizer.step()
        losses.append(loss.item())
        if iter_id > max_iters:
            break
    return sum(losses) / len(losses)


model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 1))
data = torch.utils.data.TensorDataset(torch.randn(128, 3, 16, 16), torch.rand(128, 4, 16, 16))
train_loader = torch.utils.data.DataLoader(data, batch_size=4, shuffle=True)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
criterion = torch.nn.MSELoss()
for epoch in range(2):
    print("epoch", epoch, train(model, train_loader, optimizer, criterion))
