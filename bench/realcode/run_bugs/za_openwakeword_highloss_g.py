# Source: https://github.com/dscripka/openWakeWord/issues/316
# Original: dscripka/openWakeWord openwakeword/train.py (Model.train_model), read at 368c037
# Bug: train_model keeps only the high-loss examples of each batch and "accumulates" until 128 of them are
# collected, but a micro-batch below the threshold only bumps accumulation_steps and concatenates its predictions:
# its loss is never backpropagated, optimizer.zero_grad() runs again at the next step, and only the last micro-batch's
# loss (divided by accumulation_steps) reaches optimizer.step(). Most selected examples never produce a gradient.
# Ours: a small dense classifier over random 16x96 feature windows, 30 steps, no validation data, no torchmetrics
# recall (a plain count instead); the selection, weighting and accumulation logic are theirs.
import math

import torch
from torch import nn, optim

torch.manual_seed(0)


class Model(nn.Module):
    def __init__(self, n_classes=1, input_shape=(16, 96), layer_dim=32):
        super().__init__()
        self.n_classes = n_classes
        self.device = torch.device("cpu")
        self.model = nn.Sequential(
            nn.Flatten(),
            nn.Linear(input_shape[0] * input_shape[1], layer_dim),
            nn.LayerNorm(layer_dim),
            nn.ReLU(),
            nn.Linear(layer_dim, 1),
            nn.Sigmoid(),
        )
        self.fp = lambda pred, y: (y - pred <= -0.5).sum()
        self.recall = lambda pred, y: ((pred >= 0.5) & (y == 1)).sum() / (y == 1).sum().clamp(min=1)
        self.n_fp = 0
        self.history = {"loss": [], "recall": []}
        self.loss = torch.nn.functional.binary_cross_entropy
        self.optimizer = optim.Adam(self.model.parameters(), lr=0.0001)

    def lr_warmup_cosine_decay(self, global_step, warmup_steps=0, hold=0, total_steps=0, start_lr=0.0, target_lr=1e-3):
        learning_rate = 0.5 * target_lr * (1 + math.cos(
            math.pi * (global_step - warmup_steps - hold) / float(total_steps - warmup_steps - hold)))
        warmup_lr = target_lr * (global_step / warmup_steps) if warmup_steps else target_lr
        if hold > 0:
            learning_rate = warmup_lr if global_step < warmup_steps + hold else learning_rate
        else:
            learning_rate = warmup_lr if global_step < warmup_steps else learning_rate
        return learning_rate

    def train_model(self, X, max_steps, warmup_steps, hold_steps, negative_weight_schedule=[1], lr=0.0001):  # noqa: B006
        self.to(self.device)
        self.model.to(self.device)

        accumulation_steps = 1
        accumulated_samples = 0
        accumulated_predictions = torch.Tensor([]).to(self.device)
        accumulated_labels = torch.Tensor([]).to(self.device)
        for step_ndx, data in enumerate(X, 0):
            x, y = data[0].to(self.device), data[1].to(self.device)
            y_ = y[..., None].to(torch.float32)

            for g in self.optimizer.param_groups:
                g['lr'] = self.lr_warmup_cosine_decay(step_ndx, warmup_steps=warmup_steps, hold=hold_steps,
                                                      total_steps=max_steps, target_lr=lr)

            # zero the parameter gradients
            self.optimizer.zero_grad()

            predictions = self.model(x)

            # Construct batch with only samples that have high loss
            neg_high_loss = predictions[(y == 0) & (predictions.squeeze() >= 0.001)]
            pos_high_loss = predictions[(y == 1) & (predictions.squeeze() < 0.999)]
            y = torch.cat((y[(y == 0) & (predictions.squeeze() >= 0.001)], y[(y == 1) & (predictions.squeeze() < 0.999)]))
            y_ = y[..., None].to(torch.float32)
            predictions = torch.cat((neg_high_loss, pos_high_loss))

            w = torch.ones(y.shape[0]) * negative_weight_schedule[0]
            pos_ndcs = y == 1
            w[pos_ndcs] = 1
            w = w[..., None]

            if predictions.shape[0] != 0:
                # Do backpropagation, with gradient accumulation if the batch-size after selecting high loss
                # examples is too small
                loss = self.loss(predictions, y_ if self.n_classes == 1 else y, w.to(self.device))
                loss = loss / accumulation_steps  # BUG
                accumulated_samples += predictions.shape[0]

                if predictions.shape[0] >= 128:
                    accumulated_predictions = predictions
                    accumulated_labels = y_
                if accumulated_samples < 128:
                    accumulation_steps += 1
                    accumulated_predictions = torch.cat((accumulated_predictions, predictions))
                    accumulated_labels = torch.cat((accumulated_labels, y_))
                else:
                    loss.backward()
                    self.optimizer.step()
                    accumulation_steps = 1
                    accumulated_samples = 0

                    self.history["loss"].append(loss.detach().cpu().numpy())

                    fp = self.fp(accumulated_predictions, accumulated_labels)
                    self.n_fp += fp
                    self.history["recall"].append(
                        self.recall(accumulated_predictions, accumulated_labels).detach().cpu().numpy())

                    accumulated_predictions = torch.Tensor([]).to(self.device)
                    accumulated_labels = torch.Tensor([]).to(self.device)
        return self.model


def batches(n_steps, batch_size=48):
    for _ in range(n_steps):
        x = torch.randn(batch_size, 16, 96)
        y = (x[:, :, 0].mean(dim=1) > 0).long()
        yield x, y


if __name__ == "__main__":
    oww = Model()
    oww.train_model(batches(30), max_steps=30, warmup_steps=3, hold_steps=3, negative_weight_schedule=[1])
    print("updates:", len(oww.history["loss"]), "last loss:", float(oww.history["loss"][-1]))
