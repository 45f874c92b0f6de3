"""DE-ViT region refinement losses divided by num_masks, which is 0 when a batch has no foreground proposal.

Source: https://github.com/mlzxy/devit/issues/51 ("division by zero if no masks", open, no maintainer answer; points at
devit.py L180 dice_loss, L199 sigmoid_ce_loss and L1321 the l1 loss)
Read: detectron2/modeling/meta_arch/devit.py at cfd0e0e28c8cdc8c0deff9b3f9dba7dcc1a08e61 (dice_loss,
sigmoid_ce_loss, and the regression branch of OpenSetDetectorWithExamples.forward: fg_indices = class_labels !=
num_classes, num_masks = len(pred_roi_mask), the rp/rp_out refinement stages with aux_bce / aux_dice / rg_l1 losses).
Theirs: dice_loss and sigmoid_ce_loss (sum over masks / num_masks), num_masks taken from the foreground ROIs, the
refinement loop feeding back sigmoid masks, F.l1_loss on the region coordinates, the sum of loss_dict as the
training loss (detectron2 SimpleTrainer: zero_grad, backward, step).
Ours: random ROI features and labels instead of the DINOv2 backbone, RPN and ROIAlign; two refinement stages instead
of five; a linear region-to-coordinate head; no classification branch (only_train_mask); the batch at step 6
holds background proposals only, as crops without a seen-class object do.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


def dice_loss(inputs, targets, num_masks):
    inputs = inputs.sigmoid()
    inputs = inputs.flatten(1)
    numerator = 2 * (inputs * targets).sum(-1)
    denominator = inputs.sum(-1) + targets.sum(-1)
    loss = 1 - (numerator + 1) / (denominator + 1)
    return loss.sum() / num_masks


def sigmoid_ce_loss(inputs, targets, num_masks):
    loss = F.binary_cross_entropy_with_logits(inputs, targets, reduction="none")
    return loss.mean(1).sum() / num_masks  # BUG


class RegionToCoord(nn.Module):
    def __init__(self, k=7):
        super().__init__()
        self.fc = nn.Linear(k * k, 4)

    def forward(self, mask_logits):
        return self.fc(mask_logits.flatten(1)).sigmoid()


class OpenSetDetectorWithExamples(nn.Module):
    def __init__(self, emb=16, num_classes=5, k=7):
        super().__init__()
        self.num_classes = num_classes
        self.rp1 = nn.Sequential(nn.Conv2d(emb + 1, emb, 3, padding=1), nn.ReLU())
        self.rp1_out = nn.Conv2d(emb, 1, 3, padding=1)
        self.rp2 = nn.Sequential(nn.Conv2d(emb + 2, emb, 3, padding=1), nn.ReLU())
        self.rp2_out = nn.Conv2d(emb, 1, 3, padding=1)
        self.r2c = RegionToCoord()

    def forward(self, roi_feats, class_labels, pred_roi_mask, gt_roi_mask, gt_region_coords):
        loss_dict = {}
        num_classes = self.num_classes
        fg_indices = class_labels != num_classes
        aroi_emb = roi_feats[fg_indices]
        pred_roi_mask, gt_roi_mask = pred_roi_mask[fg_indices], gt_roi_mask[fg_indices]
        gt_region_coords = gt_region_coords[fg_indices]

        masks = [pred_roi_mask[:, None, :, :].float(), ]
        num_masks = len(pred_roi_mask)
        embedding = aroi_emb
        for i, (rp, rp_out) in enumerate([(self.rp1, self.rp1_out), (self.rp2, self.rp2_out)]):
            all_mask_tensor = torch.cat(masks, dim=1)
            embedding = torch.cat([embedding, all_mask_tensor], dim=1)
            embedding = rp(embedding)
            pred_mask_logits = rp_out(embedding) / 0.1
            masks.insert(0, pred_mask_logits.sigmoid())
            pred_region_coords = self.r2c(pred_mask_logits)
            gt_roi_mask = gt_roi_mask.float()
            loss_dict[f"aux_bce_loss_{i}"] = sigmoid_ce_loss(pred_mask_logits.flatten(1), gt_roi_mask.flatten(1), num_masks)
            loss_dict[f"aux_dice_loss_{i}"] = dice_loss(pred_mask_logits.flatten(1), gt_roi_mask.flatten(1), num_masks)
            loss_dict[f"rg_l1_loss_{i}"] = F.l1_loss(pred_region_coords, gt_region_coords)
        return loss_dict


def make_batch(num_fg):
    n, k = 16, 7
    labels = torch.full((n,), 5)
    labels[:num_fg] = torch.randint(0, 5, (num_fg,))
    pred_mask = torch.rand(n, k, k) > 0.3
    gt_mask = torch.rand(n, k, k) > 0.5
    return torch.randn(n, 16, k, k), labels, pred_mask, gt_mask, torch.rand(n, 4)


torch.manual_seed(0)
model = OpenSetDetectorWithExamples()
optimizer = torch.optim.AdamW(model.parameters(), lr=2e-4, weight_decay=1e-4)
data = [make_batch(6) for _ in range(6)] + [make_batch(0)] + [make_batch(6) for _ in range(3)]
model.train()
for it, batch in enumerate(data):
    loss_dict = model(*batch)
    losses = sum(loss_dict.values())
    optimizer.zero_grad()
    losses.backward()
    optimizer.step()
