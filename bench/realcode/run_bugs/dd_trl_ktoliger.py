# Source: https://github.com/huggingface/trl/issues/7245 (KTO fixed by https://github.com/huggingface/trl/pull/7247)
# Original: huggingface/trl trl/trainer/kto_trainer.py (KTOTrainer.compute_loss with use_liger_kernel=True); from the
# issue and PR text
# Bug: compute_loss unwraps the accelerate-prepared model and, unless ZeRO-3 or FSDP is on, runs the loss on the
# unwrapped module, so DistributedDataParallel.forward never runs, its reducer is never armed and no gradient is
# all-reduced: each rank trains its own copy on its own shard and the replicas drift apart. Run with torchrun,
# 2 processes (gloo); a tiny causal LM stands in for the Qwen3 test model.
from types import SimpleNamespace

import torch
from accelerate import Accelerator

torch.manual_seed(0)


class TinyCausalLM(torch.nn.Module):
    def __init__(self, vocab=48, dim=32):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(vocab, dim)
        self.layers = torch.nn.Sequential(torch.nn.Linear(dim, 64), torch.nn.GELU(), torch.nn.Linear(64, dim))
        self.lm_head = torch.nn.Linear(dim, vocab, bias=False)

    def forward(self, input_ids):
        return SimpleNamespace(logits=self.lm_head(self.layers(self.embed_tokens(input_ids))))


class KTOTrainer:
    def __init__(self, model, args, train_dataset):
        self.args = args
        self.accelerator = Accelerator(cpu=True)
        self.is_fsdp_enabled = False
        self.use_liger_kernel = args.use_liger_kernel
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate)
        loader = torch.utils.data.DataLoader(train_dataset, batch_size=args.per_device_train_batch_size, shuffle=True)
        self.model, self.optimizer, self.train_dataloader = self.accelerator.prepare(model, optimizer, loader)

    def _completion_logps(self, model, input_ids, completion_mask):
        logits = model(input_ids[:, :-1]).logits
        per_token = torch.log_softmax(logits, dim=-1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)
        return (per_token * completion_mask[:, 1:]).sum(-1)

    def _compute_loss(self, model, inputs, return_outputs=False):
        input_ids, completion_mask, label, ref_logps = inputs
        policy_logps = self._completion_logps(model, input_ids, completion_mask)
        kl = (policy_logps - ref_logps).mean().clamp(min=0).detach()
        logratio = policy_logps - ref_logps
        desirable = 1 - torch.sigmoid(self.args.beta * (logratio - kl))
        undesirable = 1 - torch.sigmoid(self.args.beta * (kl - logratio))
        losses = torch.where(label, desirable, undesirable)
        return losses.mean()

    def compute_loss(self, model, inputs, return_outputs=False):
        is_zero3 = False
        unwrapped_model = self.accelerator.unwrap_model(model)
        if is_zero3 or self.is_fsdp_enabled:
            return self._forward_redirection(model, unwrapped_model, self._compute_loss, unwrapped_model, inputs)
        return self._compute_loss(unwrapped_model, inputs, return_outputs)  # BUG

    def train(self):
        self.model.train()
        for epoch in range(self.args.num_train_epochs):
            for step, inputs in enumerate(self.train_dataloader):
                loss = self.compute_loss(self.model, inputs)
                self.accelerator.backward(loss)
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
                self.optimizer.step()
                self.optimizer.zero_grad()
                if step % 10 == 0 and self.accelerator.is_main_process:
                    print(f"epoch {epoch} step {step} loss {loss.item():.4f}")


def make_dataset(n=256, seq=12, vocab=48):
    input_ids = torch.randint(0, vocab, (n, seq))
    completion_mask = (torch.arange(seq) >= 5).float().expand(n, seq).clone()
    label = torch.rand(n) < 0.5
    ref_logps = torch.full((n,), -3.9 * (seq - 6))
    return torch.utils.data.TensorDataset(input_ids, completion_mask, label, ref_logps)


args = SimpleNamespace(learning_rate=5e-3, per_device_train_batch_size=8, num_train_epochs=2, beta=0.1,
                       use_liger_kernel=True)
trainer = KTOTrainer(TinyCausalLM(), args, make_dataset())
trainer.train()
