# Source: https://github.com/hirofumi0810/neural_sp/issues/168
# Original: hirofumi0810/neural_sp neural_sp/bin/asr/train.py (train(), the accum_grad_n_steps branch)
# Bug: with gradient accumulation every micro-batch loss is back-propagated as it is; it is never divided by
# accum_grad_n_steps, so the accumulated gradient is accum_grad_n_steps times the mean gradient.
import torch
import torch.nn.functional as F

torch.manual_seed(0)


class Speech2Text(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = torch.nn.LSTM(20, 32, batch_first=True)
        self.out = torch.nn.Linear(32, 30)

    def forward(self, xs, ys):
        h, _ = self.enc(xs)
        logits = self.out(h)
        loss = F.cross_entropy(logits.reshape(-1, 30), ys.reshape(-1))
        return loss, {"loss.att": loss.item()}


model = Speech2Text()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
accum_grad_n_steps = 4
clip_grad_norm = 5.0
batches = [(torch.randn(4, 12, 20), torch.randint(0, 30, (4, 12))) for _ in range(64)]
accum_n_steps = 0
for step, (xs, ys) in enumerate(batches):
    loss, observation = model(xs, ys)
    loss.backward()  # BUG
    loss.detach()
    accum_n_steps += 1
    if accum_n_steps >= accum_grad_n_steps:
        if clip_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip_grad_norm)
        optimizer.step()
        optimizer.zero_grad()
        accum_n_steps = 0
    del loss
print("done")
