"""Waypoint predictor training loop that never clears the predictor's gradients.

Source: https://github.com/wz0919/waypoint-predictor/issues/4 ("Is optimizer.zero_grad() intentionally
omitted in training loop?")
Original: wz0919/waypoint-predictor waypoint_predictor.py (predict_waypoints, the 'train' branch: frozen
RGB/depth encoders, BinaryDistPredictor_TRM through TRM_predict, MSE to the target heatmap, AdamW over
the predictor), read at 2233dc1.
Bug: the loop calls total_loss.backward() and optimizer.step() on every batch and there is no
zero_grad() anywhere in the file, so each step applies the sum of all gradients since the start of
training. The issue is open and unanswered; the missing call is a fact of the code.
Ours: random panoramas (24 views) and targets, small frozen conv encoders instead of the pretrained
ResNets, an MLP over the 24 view features instead of the TRM transformer, 2 epochs, no evaluation pass,
tensorboard or checkpoints.
"""
import torch
import torch.nn as nn

torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")


class Args:
    ANGLES = 24
    NUM_CLASSES = 12
    EPOCH = 2
    BATCH_SIZE = 2
    LEARNING_RATE = 1e-4
    WEIGHT = 0
    HIDDEN_DIM = 64


class RGBEncoder(nn.Module):
    def __init__(self, trainable=False):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        for p in self.parameters():
            p.requires_grad = trainable

    def forward(self, x):
        return self.net(x.flatten(0, 1))


class DepthEncoder(RGBEncoder):
    def __init__(self, trainable=False):
        super().__init__(trainable)
        self.net[0] = nn.Conv2d(1, 8, 3, 2, 1)
        for p in self.parameters():
            p.requires_grad = trainable


class BinaryDistPredictor_TRM(nn.Module):
    def __init__(self, args, hidden_dim, n_classes):
        super().__init__()
        self.visual_fc = nn.Sequential(nn.Linear(16, hidden_dim), nn.ReLU())
        self.mix = nn.Linear(args.ANGLES * hidden_dim, args.ANGLES * hidden_dim)
        self.vis_classifier = nn.Linear(hidden_dim, n_classes)


def TRM_predict(mode, args, predictor, rgb_feats, depth_feats):
    feats = predictor.visual_fc(torch.cat([rgb_feats, depth_feats], -1)).view(-1, args.ANGLES, args.HIDDEN_DIM)
    feats = torch.relu(predictor.mix(feats.flatten(1))).view(-1, args.ANGLES, args.HIDDEN_DIM)
    vis_logits = predictor.vis_classifier(feats)
    if mode == "train":
        return vis_logits
    return torch.sigmoid(vis_logits), vis_logits


class RGBDepthPano(torch.utils.data.Dataset):
    def __len__(self):
        return 32

    def __getitem__(self, idx):
        g = torch.Generator().manual_seed(idx)
        return {"scan_id": idx, "rgb": torch.rand(Args.ANGLES, 3, 16, 16, generator=g),
                "depth": torch.rand(Args.ANGLES, 1, 16, 16, generator=g),
                "target": (torch.rand(Args.ANGLES, Args.NUM_CLASSES, generator=g) > 0.9).float()}


def predict_waypoints(args):
    rgb_encoder = RGBEncoder(trainable=False).to(device)
    depth_encoder = DepthEncoder(trainable=False).to(device)
    predictor = BinaryDistPredictor_TRM(args=args, hidden_dim=args.HIDDEN_DIM, n_classes=args.NUM_CLASSES).to(device)
    trainloader = torch.utils.data.DataLoader(RGBDepthPano(), batch_size=args.BATCH_SIZE, shuffle=True, num_workers=0)

    criterion_mse = torch.nn.MSELoss(reduction="none")
    params = list(predictor.parameters())
    optimizer = torch.optim.AdamW(params, lr=args.LEARNING_RATE)

    for epoch in range(args.EPOCH):
        sum_loss = 0.0
        rgb_encoder.eval()
        depth_encoder.eval()
        predictor.train()

        for i, data in enumerate(trainloader):
            rgb_imgs = data["rgb"].to(device)
            depth_imgs = data["depth"].to(device)
            rgb_feats = rgb_encoder(rgb_imgs)
            depth_feats = depth_encoder(depth_imgs)
            target = data["target"].to(device)

            vis_logits = TRM_predict("train", args, predictor, rgb_feats, depth_feats)
            loss_vis = criterion_mse(vis_logits, target)
            total_loss = loss_vis.sum() / vis_logits.size(0) / args.ANGLES

            total_loss.backward()  # BUG
            optimizer.step()
            sum_loss += total_loss.item()
        print(f"Epoch {epoch + 1}/{args.EPOCH} Train Loss: {sum_loss / (i + 1):.5f}")


predict_waypoints(Args())
