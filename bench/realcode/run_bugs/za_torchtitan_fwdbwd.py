# Source: https://github.com/pytorch/torchtitan/pull/3575
# Original: pytorch/torchtitan torchtitan/experiments/rl (the trainer's forward_backward / optim_step API)
# Bug: the trainer zeroes the gradients inside forward_backward, which the controller calls once per micro-batch,
# so each optimizer step applies only the last micro-batch's gradient instead of the accumulated one.
import torch
import torch.nn.functional as F

torch.manual_seed(0)


class PolicyTrainer:
    def __init__(self, model, lr, grad_accum_steps):
        self.model = model
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
        self.grad_accum_steps = grad_accum_steps

    def forward_backward(self, tokens, advantages):
        self.optimizer.zero_grad()  # BUG
        logits = self.model(tokens[:, :-1])
        logp = F.log_softmax(logits, dim=-1).gather(-1, tokens[:, 1:, None]).squeeze(-1)
        loss = -(logp.sum(-1) * advantages).mean() / self.grad_accum_steps
        loss.backward()
        return loss.item()

    def optim_step(self):
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()


vocab = 64
policy = torch.nn.Sequential(torch.nn.Embedding(vocab, 32), torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, vocab))
trainer = PolicyTrainer(policy, lr=1e-3, grad_accum_steps=4)
for step in range(40):
    total = 0.0
    for micro in range(trainer.grad_accum_steps):
        rollout = torch.randint(0, vocab, (8, 12))
        total += trainer.forward_backward(rollout, torch.randn(8))
    trainer.optim_step()
    if step % 10 == 0:
        print("step", step, "loss", round(total, 4))
