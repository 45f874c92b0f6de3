# The loss helpers of lz_dice_imported.py (see its header).
import torch


def soft_dice_log(pred, target, eps=0.0):
    inter = (pred * target).sum(-1)
    union = pred.sum(-1) + target.sum(-1)
    return -torch.log(2 * inter / (union + eps)).mean()  # BUG
