"""Source: https://github.com/automl/TFM-Playground/commit/ddf29f8ba7c9de81cf5eb9b5cb7d75817fd9007c
("fix gradient accumulation when skipping nans"). Read: tfmplayground/train.py (train) at the fix's parent
(ddf29f8^).

Bug: train() skips prior batches that contain NaN (`continue` before the backward), but decides when to step with
the enumerate index: `if (i + 1) % accumulate_gradients == 0`. When a skipped batch falls on a step index, the
optimizer step is skipped and that window's gradients are merged into the next one (twice the micro-batches,
divided by accumulate_gradients only once); when it is the epoch's last batch, the micro-batches accumulated
since the previous step never reach an optimizer step at all (dropped after the final epoch). The fix counts the
micro-batches that really ran backward and steps on any remainder at the end of the epoch.

Theirs: train()'s loop verbatim from `for epoch` to the checkpoint dict (the NaN test and `continue`, the
classification branch, `losses.mean() / accumulate_gradients`, clip_grad_norm_ 1.0, step and zero_grad in that
order, model.eval()/optimizer.eval() and the checkpoint after each epoch). Ours: a tiny NanoTabPFN-like model
(per-cell embeddings, one transformer layer over rows), a prior that yields random tabular batches and, at fixed
positions, a batch with a NaN feature (their priors can emit NaN); AdamW with no-op train()/eval() in place of
schedulefree.AdamWScheduleFree (not installed); no callbacks, DataParallel or regression branch; the checkpoint
written under a temporary folder.
"""
import os
import tempfile

import torch
from torch import nn

torch.manual_seed(0)


class AdamWScheduleFree(torch.optim.AdamW):
    def train(self):
        pass

    def eval(self):
        pass


class NanoTabPFNModel(nn.Module):
    def __init__(self, embedding_size=32, num_attention_heads=4, mlp_hidden_size=64, num_layers=1, num_outputs=3):
        super().__init__()
        self.embedding_size = embedding_size
        self.num_attention_heads = num_attention_heads
        self.mlp_hidden_size = mlp_hidden_size
        self.num_layers = num_layers
        self.num_outputs = num_outputs
        self.feature_encoder = nn.Linear(1, embedding_size)
        self.target_encoder = nn.Embedding(num_outputs + 1, embedding_size)
        self.layer = nn.TransformerEncoderLayer(embedding_size, num_attention_heads, mlp_hidden_size, batch_first=True)
        self.decoder = nn.Linear(embedding_size, num_outputs)

    def forward(self, src, single_eval_pos):
        x, y_train = src
        cells = self.feature_encoder(x.unsqueeze(-1)).mean(2)
        y_full = torch.full(cells.shape[:2], self.num_outputs, dtype=torch.long)
        y_full[:, :single_eval_pos] = y_train.long()
        rows = self.layer(cells + self.target_encoder(y_full))
        return self.decoder(rows[:, single_eval_pos:])


class Prior:
    def __init__(self, num_steps, nan_at):
        self.num_steps = num_steps
        self.nan_at = nan_at
        self.epoch = 0

    def __iter__(self):
        self.epoch += 1
        for step in range(self.num_steps):
            x = torch.randn(8, 40, 5)
            y = (x[..., 0] > 0).long() + (x[..., 1] > 1).long()
            if (self.epoch, step) in self.nan_at:
                x[0, 3, 2] = float("nan")
            yield {"x": x, "y": y.float(), "target_y": y.float(), "single_eval_pos": 30}


def train(model, prior, criterion, epochs, accumulate_gradients=1, lr=1e-4, device=torch.device("cpu"),
          run_name="nanoTFM"):
    work_dir = os.path.join(tempfile.mkdtemp(), run_name)
    os.makedirs(work_dir, exist_ok=True)
    model.to(device)
    optimizer = AdamWScheduleFree(model.parameters(), lr=lr, weight_decay=0.0)
    classification_task = isinstance(criterion, nn.CrossEntropyLoss)

    assert prior.num_steps % accumulate_gradients == 0, 'num_steps must be divisible by accumulate_gradients'

    for epoch in range(1, epochs + 1):
        model.train()  # Turn on the train mode
        optimizer.train()
        total_loss = 0.
        num_valid_data = 0
        for i, full_data in enumerate(prior):
            single_eval_pos = full_data['single_eval_pos']
            data = (full_data['x'].to(device),
                    full_data['y'][:, :single_eval_pos].to(device))
            if (torch.isnan(data[0]).any() or torch.isnan(data[1]).any()):
                continue
            num_valid_data += 1
            targets = full_data['target_y'].to(device)

            output = model(data, single_eval_pos=single_eval_pos)
            targets = targets[:, single_eval_pos:]
            if classification_task:
                targets = targets.reshape((-1,)).to(torch.long)
                output = output.reshape(-1, output.shape[-1])

            losses = criterion(output, targets)
            loss = losses.mean() / accumulate_gradients
            loss.backward()
            total_loss += loss.cpu().detach().item() * accumulate_gradients

            if (i + 1) % accumulate_gradients == 0:  # BUG
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.)
                optimizer.step()
                optimizer.zero_grad()

        mean_loss = total_loss / max(num_valid_data, 1)
        model.eval()
        optimizer.eval()
        training_state = {
            'epoch': epoch,
            'model': model.state_dict(),
            'optimizer': optimizer.state_dict(),
        }
        torch.save(training_state, work_dir + '/latest_checkpoint.pth')
        print(f"epoch {epoch} mean loss {mean_loss:.4f}")
    return model


criterion = nn.CrossEntropyLoss(reduction="none")
train(NanoTabPFNModel(), Prior(num_steps=16, nan_at={(1, 7), (2, 11), (3, 15)}), criterion, epochs=3,
      accumulate_gradients=4, lr=1e-3)
