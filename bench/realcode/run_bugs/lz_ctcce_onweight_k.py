# Source: https://github.com/york135/CTC_CE_for_AST/issues/3
# Original: york135/CTC_CE_for_AST predictor.py (NoteLevelAST.count_loss, fit), read at 189eb48
# Bug: in the first epochs (no CTC) the onset and offset BCE terms are weighted sums divided by torch.sum(on_weight)
# and torch.sum(off_weight); a training segment with no onset frame has all-zero weights, so the division is 0/0,
# the loss is nan and Adam writes nan into every weight. The maintainer added a small epsilon to the divisor.
# Our frame model, segment sizes and synthetic weights; the pitch terms and the CTC branch are kept in outline. The
# criteria are BCEWithLogitsLoss (an option the original file carries in comments): BCELoss on CPU raises on the nan
# outputs of the step after, where the original on the GPU only reported the nan loss.
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

torch.manual_seed(0)
FRAMES = 40


class Segments(Dataset):
    def __len__(self):
        return 48

    def __getitem__(self, idx):
        g = torch.Generator().manual_seed(idx)
        feat = torch.randn(FRAMES, 16, generator=g)
        onset = (torch.rand(FRAMES, generator=g) < 0.1).float()
        offset = torch.roll(onset, 3)
        if idx % 6 == 5:  # a segment of silence or one long note: no onset, no offset
            onset.zero_()
            offset.zero_()
        # frame weights: onset frames and their neighbours count, the rest do not
        weights = torch.stack([F.max_pool1d(onset[None, None], 5, 1, 2)[0, 0], F.max_pool1d(offset[None, None], 5, 1, 2)[0, 0]])
        pitch = torch.randint(0, 12, (FRAMES,), generator=g)
        return feat, weights, torch.stack([onset, offset]), pitch


class FrameNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.GRU(16, 32, batch_first=True)
        self.on_off = nn.Linear(32, 3)
        self.pitch = nn.Linear(32, 12)

    def forward(self, x):
        h, _ = self.body(x)
        return self.on_off(h), self.pitch(h)


class NoteLevelAST:
    def __init__(self):
        self.model = FrameNet()
        self.training_dataset = Segments()

    def count_loss(self, batch, model_output, total_split_loss, use_ctc):
        on_off_logits_sm, pitch_logits = model_output
        onset_logits = on_off_logits_sm[:, :, 1]
        offset_logits = on_off_logits_sm[:, :, 2]
        on_weight = batch[1][0][0:1].float()
        off_weight = batch[1][0][1:2].float()
        onset_prob = batch[2][:, 0]
        offset_prob = batch[2][:, 1]
        if use_ctc:
            raise NotImplementedError("the CTC epochs start after epoch 5")
        split_train_loss0 = torch.dot(self.onset_criterion(onset_logits, onset_prob)[0], on_weight[0]) / torch.sum(on_weight)  # BUG
        split_train_loss1 = torch.dot(self.offset_criterion(offset_logits, offset_prob)[0], off_weight[0]) / torch.sum(off_weight)
        split_train_loss2 = self.pitch_criterion(pitch_logits.permute(0, 2, 1), batch[3])
        total_split_loss[0] += split_train_loss0.item()
        total_split_loss[1] += split_train_loss1.item()
        total_split_loss[2] += split_train_loss2.item()
        return split_train_loss0 + split_train_loss1 + split_train_loss2

    def fit(self, epoch, lr):
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=lr)
        self.onset_criterion = nn.BCEWithLogitsLoss(reduction="none")
        self.offset_criterion = nn.BCEWithLogitsLoss(reduction="none")
        self.pitch_criterion = nn.CrossEntropyLoss(ignore_index=100)
        self.train_loader = DataLoader(self.training_dataset, batch_size=1, shuffle=True)
        for ep in range(1, epoch + 1):
            self.model.train()
            total_training_loss = 0
            total_split_loss = [0.0, 0.0, 0.0]
            for batch_idx, batch in enumerate(self.train_loader):
                self.optimizer.zero_grad()
                model_output = self.model(batch[0])
                loss = self.count_loss(batch, model_output, total_split_loss, use_ctc=ep > 5)
                loss.backward()
                self.optimizer.step()
                total_training_loss += loss.item()
            print(f"| Epoch [{ep:4d}/{epoch:4d}] Train Loss {total_training_loss / len(self.train_loader):.4f}")


predictor = NoteLevelAST()
predictor.fit(epoch=3, lr=1e-3)
