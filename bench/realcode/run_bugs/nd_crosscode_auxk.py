# Source: https://github.com/oclivegriffin/crosscode/pull/3
# Original: oclivegriffin/crosscode the TopK crosscoder trainer (_calculate_loss_and_log, base trainer run_batch)
# Bug: the trainer builds loss = reconstruction_loss + lambda_aux * aux_loss but returns reconstruction_loss in
# both branches, and the returned tensor is the one back-propagated: the AuxK dead-latent term is logged but never
# trained, so latents that went dead stay dead.
import torch

torch.manual_seed(0)


class TopKCrosscoder(torch.nn.Module):
    def __init__(self, d_model=16, n_latents=64, k=4):
        super().__init__()
        self.k = k
        self.W_enc = torch.nn.Parameter(torch.randn(d_model, n_latents) * 0.1)
        self.b_enc = torch.nn.Parameter(torch.zeros(n_latents))
        self.W_dec = torch.nn.Parameter(torch.randn(n_latents, d_model) * 0.1)
        self.b_dec = torch.nn.Parameter(torch.zeros(d_model))

    def encode_pre(self, x):
        return (x - self.b_dec) @ self.W_enc + self.b_enc

    def forward(self, x):
        pre = self.encode_pre(x)
        top = torch.topk(pre, self.k, dim=-1)
        latents = torch.zeros_like(pre).scatter(-1, top.indices, torch.relu(top.values))
        return latents @ self.W_dec + self.b_dec, pre, latents


class TopKTrainer:
    def __init__(self, model, lr=1e-3, lambda_aux=1 / 32, k_aux=8, dead_after=20, grad_accum=1):
        self.model = model
        self.optimizer = torch.optim.Adam(model.parameters(), lr=lr)
        self.lambda_aux, self.k_aux, self.dead_after, self.grad_accum = lambda_aux, k_aux, dead_after, grad_accum
        self.steps_since_fired = torch.zeros(model.W_enc.shape[1])

    def aux_loss(self, x, recon, pre):
        dead = self.steps_since_fired > self.dead_after
        if not dead.any():
            return recon.new_zeros(())
        residual = x - recon.detach()
        dead_pre = pre.masked_fill(~dead, float("-inf"))
        top = torch.topk(dead_pre, min(self.k_aux, int(dead.sum())), dim=-1)
        aux_latents = torch.zeros_like(pre).scatter(-1, top.indices, torch.relu(top.values))
        aux_recon = aux_latents @ self.model.W_dec
        return (aux_recon - residual).pow(2).sum(-1).mean() / residual.pow(2).sum(-1).mean()

    def _calculate_loss_and_log(self, x, log):
        recon, pre, latents = self.model(x)
        fired = (latents > 0).any(0)
        self.steps_since_fired = torch.where(fired, torch.zeros_like(self.steps_since_fired), self.steps_since_fired + 1)
        reconstruction_loss = (recon - x).pow(2).sum(-1).mean()
        aux_loss = self.aux_loss(x, recon, pre)
        loss = reconstruction_loss + self.lambda_aux * aux_loss
        if log:
            log_dict = {"train/loss": loss.item(), "train/aux_loss": aux_loss.item()}
            return reconstruction_loss, log_dict
        return reconstruction_loss, None  # BUG

    def run_batch(self, x, log):
        loss, log_dict = self._calculate_loss_and_log(x, log)
        loss.div(self.grad_accum).backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        return log_dict


trainer = TopKTrainer(TopKCrosscoder())
directions = torch.randn(8, 16)
for step in range(120):
    x = torch.randn(64, 8).relu() @ directions
    log_dict = trainer.run_batch(x, log=step % 40 == 0)
    if log_dict:
        print("step", step, log_dict, "dead", int((trainer.steps_since_fired > trainer.dead_after).sum()))
