# Source: https://github.com/BatsResearch/labelmodels/issues/4
# Original: BatsResearch/labelmodels labelmodels/label_model.py (LabelModel._do_estimate_label_model, at 3b5683b)
# Bug: the model's own fitting method sums each batch's loss tensor into `running_loss` to log the epoch loss; the
# sum keeps every batch's autograd graph alive until the epoch ends (the reporter's GPU ran out of memory on a
# large training set).
import numpy as np
import torch

torch.manual_seed(0)


class LabelModel(torch.nn.Module):
    def _do_estimate_label_model(self, batches, epochs, step_size=0.05, momentum=0.9):
        optimizer = torch.optim.SGD(self.parameters(), lr=step_size, momentum=momentum, weight_decay=0)
        for epoch in range(epochs):
            self.train()
            running_loss = 0.0
            for i_batch, inputs in enumerate(batches):
                optimizer.zero_grad()
                log_likelihood = self(*inputs)
                loss = -1 * torch.mean(log_likelihood)
                loss += self._get_regularization_loss()
                loss.backward()
                optimizer.step()
                running_loss += loss  # BUG
            epoch_loss = running_loss / len(batches)
            print("epoch", epoch, f"train loss {float(epoch_loss):.4f}")


class NaiveBayes(LabelModel):
    def __init__(self, num_classes, num_lfs, init_acc=0.9, acc_prior=0.025):
        super().__init__()
        self.num_classes, self.num_lfs, self.acc_prior = num_classes, num_lfs, acc_prior
        init = -1 * np.log(1.0 / init_acc - 1) / 2
        self.init_acc = init
        self.accuracy = torch.nn.Parameter(torch.full((num_lfs, num_classes), float(init)))
        self.propensity = torch.nn.Parameter(torch.zeros(num_lfs))
        self.class_balance = torch.nn.Parameter(torch.zeros(num_classes))

    def forward(self, votes):
        # votes: (n, num_lfs) in {0 (abstain), 1..num_classes}
        acc = torch.sigmoid(2 * self.accuracy)
        prop = torch.sigmoid(self.propensity)
        voted = (votes > 0).float()
        cond = torch.zeros(votes.shape[0], self.num_classes)
        for k in range(self.num_classes):
            correct = (votes == k + 1).float()
            wrong = voted - correct
            p = correct * torch.log(acc[:, k] * prop) + wrong * torch.log((1 - acc[:, k]) * prop / (self.num_classes - 1))
            cond[:, k] = (p + (1 - voted) * torch.log(1 - prop)).sum(1)
        return torch.logsumexp(cond + torch.log_softmax(self.class_balance, 0), dim=1)

    def _get_regularization_loss(self):
        return self.acc_prior * torch.norm(self.accuracy - self.init_acc) ** 2

    def estimate_label_model(self, votes, epochs=3, batch_size=32):
        batches = [(votes[i:i + batch_size],) for i in range(0, len(votes), batch_size)]
        self._do_estimate_label_model(batches, epochs)


g = torch.Generator().manual_seed(1)
truth = torch.randint(1, 4, (2400,), generator=g)
votes = torch.where(torch.rand(2400, 8, generator=g) < 0.7, truth[:, None], torch.randint(1, 4, (2400, 8), generator=g))
votes = torch.where(torch.rand(2400, 8, generator=g) < 0.3, torch.zeros_like(votes), votes)
NaiveBayes(num_classes=3, num_lfs=8).estimate_label_model(votes)
