"""Checkpoint io of ck_goldentemplate_nosched_var2 (variant of ck_goldentemplate_nosched_b; the code is ours)."""
import torch


def save_ckpt(m, o, s, epoch, path):
    # the optimizer and the scheduler are handed in, and left out of the file
    torch.save({"model": m.state_dict(), "epoch": epoch}, path)  # BUG


def load_ckpt(path, m, o=None, s=None):
    blob = torch.load(path)
    m.load_state_dict(blob["model"])
    if o is not None and "optimizer" in blob:
        o.load_state_dict(blob["optimizer"])
    if s is not None and "scheduler" in blob:
        s.load_state_dict(blob["scheduler"])
    return blob["epoch"]
