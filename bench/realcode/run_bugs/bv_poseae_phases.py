# Source: https://github.com/princeton-vl/pose-ae-train/issues/11
# Original: princeton-vl/pose-ae-train task/pose.py (make_train) called from train.py's phase loop
# Bug: make_train runs zero_grad/backward/step for both the 'train' and the 'valid' phase, so the network
# is updated on validation batches (and never switched to eval for them).
import torch
import torch.nn.functional as F

torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 1))
optimizer = torch.optim.Adam(net.parameters(), lr=2e-4)


def make_train(batch_id, config, phase, imgs, heatmaps):
    preds = net(imgs)
    loss = F.mse_loss(preds, heatmaps)
    optimizer.zero_grad()
    loss.backward()  # BUG
    optimizer.step()
    return loss.item()


data = {"train": [(torch.randn(2, 3, 16, 16), torch.rand(2, 4, 16, 16)) for _ in range(10)],
        "valid": [(torch.randn(2, 3, 16, 16), torch.rand(2, 4, 16, 16)) for _ in range(4)]}
for epoch in range(3):
    for phase in ["train", "valid"]:
        for i, (imgs, heatmaps) in enumerate(data[phase]):
            make_train(i, {}, phase, imgs, heatmaps)
print("done")
