# Source: https://github.com/mialbro/PointFusion/issues/1
# Original: mialbro/PointFusion src/Loss.py (unsupervisedLoss) and src/PointFusion.py, read at 5d5c75f^; the training
# loop is the one of 5d5c75f ("fixed exploding gradients", the commit that added the eps)
# Bug: unsupervisedLoss takes torch.log(pred_scores) of the per-point scores; the scores are a softmax, and once a
# score underflows to 0 the loss is inf (the reporter: "the loss remains inf even after approx 200 epochs"; the
# author: "Caused by log(0). Fixed by adding epsilon to log", torch.log(pred_scores + eps)).
# Ours: tiny image and point-cloud encoders instead of ResNet and PointNet, random crops, random point clouds in
# millimetres around 0.5-1.5 m of depth, 2 epochs of 4 batches; the score head's weights are scaled x40 at start, a
# stand-in for a head whose logits spread across the batch (the trigger is ours). The fusion head, its softmax over
# dim 0, the loss and the loop order are theirs.
import torch
import torch.nn as nn

torch.manual_seed(0)


def unsupervisedLoss(pred_offsets, pred_scores, offsets):
    weight = 0.1
    L1 = nn.SmoothL1Loss(reduction='none')
    loss_offset = L1(pred_offsets, offsets)  # [B x pnts x 8 x 3]
    loss_offset = torch.mean(loss_offset, (2, 3))  # [B x pnts]
    # [B x pnts]
    loss = ((loss_offset * pred_scores) - (weight * torch.log(pred_scores)))  # BUG
    loss = loss.mean()  # [1]
    return loss


class ResNetFeatures(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(),
                                 nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 64))

    def forward(self, img):
        return self.net(img).unsqueeze(1)  # B x 1 x 64


class PointNetEncoder(nn.Module):
    def __init__(self, channel=3):
        super().__init__()
        self.conv1 = nn.Conv1d(channel, 32, 1)
        self.conv2 = nn.Conv1d(32, 64, 1)
        self.relu = nn.ReLU()

    def forward(self, cloud):  # B x 3 x N
        point_feats = self.relu(self.conv1(cloud))  # B x 32 x N
        x = self.relu(self.conv2(point_feats))
        global_feats = torch.max(x, 2, keepdim=True)[0].transpose(1, 2)  # B x 1 x 64
        return point_feats.transpose(1, 2), global_feats


class PointFusion(nn.Module):
    def __init__(self):
        super().__init__()
        self.image_embedding = ResNetFeatures()
        self.pcl_embedding = PointNetEncoder(channel=3)
        self.fc1 = nn.Linear(64 + 32 + 64, 128)
        self.fc2 = nn.Linear(128, 64)
        self.fc3 = nn.Linear(64, 64)
        self.fc4 = nn.Linear(64, 24)
        self.fc5 = nn.Linear(64, 1)
        self.relu = torch.nn.ReLU()
        self.softmax = nn.Softmax(dim=0)
        with torch.no_grad():
            self.fc5.weight.mul_(40.0)

    def forward(self, img, cloud):
        B, N, D = cloud.shape
        img_feats = self.image_embedding(img)
        point_feats, global_feats = self.pcl_embedding(cloud)
        img_feats = img_feats.repeat(1, D, 1)
        global_feats = global_feats.repeat(1, D, 1)
        dense_feats = torch.cat([img_feats, point_feats, global_feats], 2)
        x = self.fc1(dense_feats)
        x = self.relu(x)
        x = self.fc2(x)
        x = self.relu(x)
        x = self.fc3(x)
        x = self.relu(x)
        corner_offsets = self.fc4(x)
        corner_offsets = corner_offsets.view(B, D, 8, 3)
        scores = self.fc5(x)
        scores = self.softmax(scores)
        scores = scores.view(B, D)
        return corner_offsets, scores




def make_batch(batch_size=10, pnt_cnt=100):
    # random crops, point clouds in millimetres (N x 3, permuted to 3 x N as in train.py), corner offsets
    cloud = torch.randn(batch_size, pnt_cnt, 3) * 50.0
    cloud[:, :, 2] += torch.empty(batch_size, 1).uniform_(500.0, 1500.0)
    return torch.rand(batch_size, 3, 64, 64), cloud, torch.randn(batch_size, pnt_cnt, 8, 3) * 50.0


train_loader = [make_batch() for _ in range(4)]

device = torch.device('cpu')
model = PointFusion().to(device)
criterion = unsupervisedLoss
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

for epoch in range(2):
    running_loss = 0.0
    for batch_idx, (img, cloud, target) in enumerate(train_loader):
        cloud = cloud.permute(0, 2, 1)
        img = img.to(device)
        cloud = cloud.to(device)
        target = target.to(device)

        # forward
        pred_offset, pred_prob = model(img, cloud)
        loss = criterion(pred_offset, pred_prob, target)

        # backward
        optimizer.zero_grad()
        loss.backward()

        # statistics
        running_loss += loss.item()

        # gradient descent
        optimizer.step()
    print(f'[{epoch + 1}] loss: {running_loss / len(train_loader):.3f}')
