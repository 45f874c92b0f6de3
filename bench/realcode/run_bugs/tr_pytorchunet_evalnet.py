# Source: https://github.com/milesial/Pytorch-UNet/commit/773ef215d41c1f36dc0ed4159c12df89d792fbc3
# Original: milesial/Pytorch-UNet train.py (train_net) and eval.py (eval_net)
# Bug: train_net calls eval_net() several times per epoch from inside the batch loop; eval_net sets
# net.eval() and never switches back, so the remaining batches train with BatchNorm in eval mode.
import torch
import torch.nn.functional as F

torch.manual_seed(0)


def eval_net(net, loader):
    net.eval()
    tot = 0.0
    for imgs, true_masks in loader:
        with torch.no_grad():
            mask_pred = net(imgs)
        tot += F.binary_cross_entropy_with_logits(mask_pred, true_masks).item()
    return tot / len(loader)


def train_net(net, epochs=2):
    optimizer = torch.optim.RMSprop(net.parameters(), lr=1e-3, weight_decay=1e-8, momentum=0.9)
    train_loader = [(torch.randn(2, 3, 16, 16), (torch.rand(2, 1, 16, 16) > 0.5).float()) for _ in range(20)]
    val_loader = train_loader[:3]
    global_step = 0
    for epoch in range(epochs):
        net.train()
        for imgs, true_masks in train_loader:
            masks_pred = net(imgs)
            loss = F.binary_cross_entropy_with_logits(masks_pred, true_masks)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            global_step += 1
            if global_step % 8 == 0:
                val_score = eval_net(net, val_loader)  # BUG
                print("val", val_score)


net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                          torch.nn.Conv2d(8, 1, 1))
train_net(net)
