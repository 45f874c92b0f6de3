# Source: https://github.com/piergiaj/pytorch-i3d/issues/44
# Original: piergiaj/pytorch-i3d train_i3d.py (run), at 05783d1
# Bug: gradients are accumulated over num_steps_per_update batches, but optimizer.zero_grad() also runs at the start
# of every phase; when the train loader's length is not a multiple of num_steps_per_update, the last batches' gradients
# of each training pass are wiped at the switch to validation and never stepped (issue comment by burak43).
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import optim
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)


class TinyI3D(nn.Module):
    def __init__(self, num_classes=5):
        super().__init__()
        self.conv1 = nn.Conv3d(3, 8, kernel_size=(3, 3, 3), padding=1)
        self.conv2 = nn.Conv3d(8, 16, kernel_size=(3, 3, 3), padding=1)
        self.dropout = nn.Dropout(0.5)
        self.logits = nn.Conv3d(16, num_classes, kernel_size=1)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool3d(x, kernel_size=(1, 2, 2))
        x = F.relu(self.conv2(x))
        x = F.adaptive_avg_pool3d(x, (None, 1, 1))  # keep time
        return self.logits(self.dropout(x)).squeeze(3).squeeze(3)  # B x C x T'


def make_loader(n, shuffle):
    clips = torch.randn(n, 3, 6, 12, 12)
    labels = torch.zeros(n, 5, 6)
    cls = torch.randint(0, 5, (n,))
    for i in range(n):
        labels[i, cls[i]] = 1.0
        clips[i, :, :, : 2 + 2 * cls[i]] += 0.5
    return DataLoader(TensorDataset(clips, labels), batch_size=4, shuffle=shuffle)


dataloaders = {"train": make_loader(40, True), "val": make_loader(12, False)}  # 10 train batches per pass
i3d = TinyI3D()
optimizer = optim.SGD(i3d.parameters(), lr=0.1, momentum=0.9, weight_decay=0.0000001)
lr_sched = optim.lr_scheduler.MultiStepLR(optimizer, [30, 60])
num_steps_per_update = 4  # accum gradient
max_steps = 16
steps = 0
while steps < max_steps:
    print(f"Step {steps}/{max_steps}")
    for phase in ["train", "val"]:
        i3d.train(phase == "train")
        tot_loss = tot_loc_loss = tot_cls_loss = 0.0
        num_iter = 0
        optimizer.zero_grad()  # BUG
        for inputs, labels in dataloaders[phase]:
            num_iter += 1
            t = inputs.size(2)
            per_frame_logits = F.interpolate(i3d(inputs), t, mode="linear")
            loc_loss = F.binary_cross_entropy_with_logits(per_frame_logits, labels)
            tot_loc_loss += loc_loss.item()
            cls_loss = F.binary_cross_entropy_with_logits(torch.max(per_frame_logits, dim=2)[0],
                                                          torch.max(labels, dim=2)[0])
            tot_cls_loss += cls_loss.item()
            loss = (0.5 * loc_loss + 0.5 * cls_loss) / num_steps_per_update
            tot_loss += loss.item()
            loss.backward()
            if num_iter == num_steps_per_update and phase == "train":
                steps += 1
                num_iter = 0
                optimizer.step()
                optimizer.zero_grad()
                lr_sched.step()
                if steps % 4 == 0:
                    n = 4 * num_steps_per_update
                    print(f"{phase} Loc Loss: {tot_loc_loss / n:.4f} Cls Loss: {tot_cls_loss / n:.4f} "
                          f"Tot Loss: {tot_loss / 4:.4f}")
                    tot_loss = tot_loc_loss = tot_cls_loss = 0.0
        if phase == "val":
            print(f"{phase} Loc Loss: {tot_loc_loss / num_iter:.4f} Cls Loss: {tot_cls_loss / num_iter:.4f} "
                  f"Tot Loss: {tot_loss * num_steps_per_update / num_iter:.4f}")
