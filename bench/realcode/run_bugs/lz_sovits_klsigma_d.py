"""so-vits-svc KL loss with a log of the masked prior sigma, zero on every padded frame.

Source: https://github.com/svc-develop-team/so-vits-svc/commit/107b2ce87bbcd7ee82d57c13a54675df6f89a580
("Update losses.py", the revert two days later), read at its parent
0e39e3f8896a96ad2964fa3e1b3dc3dbe233a5b1 ("Update losses.py: fix incorrect kl loss calculation",
modules/losses.py: kl_loss; train.py: train_and_evaluate).

Theirs: kl_loss as at that commit, and the generator half of train_and_evaluate (net_g returning
z_mask and (z, z_p, m_p, logs_p, m_q, logs_q), loss_mel * c_mel + kl_loss(...) * c_kl under
autocast(enabled=False), optim_g.zero_grad, scaler.scale(...).backward, unscale_, commons.clip_grad_value_(..., None), step,
update; c_mel 45, c_kl 1.0 from their config). Ours: a small VITS-like generator (1x1-conv prior
and posterior, a 1x1-conv "flow", a linear decoder) instead of SynthesizerTrn; random content
features and spectrograms with per-utterance lengths instead of the audio data set; no
discriminator, feature-matching, f0 or speaker terms; 6 steps; CPU, fp32 (fp16_run off).

The bug: sigma = exp(logs_p) * z_mask is exactly 0 on every padded frame, so
torch.log(2 * pi * sigma**2) is -inf there; kl * z_mask then turns those frames into
-inf * 0 = NaN and the KL loss (and every gradient) is NaN for any batch with padding, i.e.
any batch of utterances of different lengths. The revert removes the three added lines.
"""
import torch
import torch.nn.functional as F
from torch import nn


def sequence_mask(length, max_length=None):
    if max_length is None:
        max_length = length.max()
    x = torch.arange(max_length, dtype=length.dtype, device=length.device)
    return x.unsqueeze(0) < length.unsqueeze(1)


def clip_grad_value_(parameters, clip_value, norm_type=2):
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    parameters = list(filter(lambda p: p.grad is not None, parameters))
    norm_type = float(norm_type)
    if clip_value is not None:
        clip_value = float(clip_value)

    total_norm = 0
    for p in parameters:
        param_norm = p.grad.data.norm(norm_type)
        total_norm += param_norm.item() ** norm_type
        if clip_value is not None:
            p.grad.data.clamp_(min=-clip_value, max=clip_value)
    total_norm = total_norm ** (1. / norm_type)
    return total_norm


def kl_loss(z_p, logs_q, m_p, logs_p, z_mask):
    """
    z_p, logs_q: [b, h, t_t]
    m_p, logs_p: [b, h, t_t]
    """
    z_p = z_p.float()
    logs_q = logs_q.float()
    m_p = m_p.float()
    logs_p = logs_p.float()
    z_mask = z_mask.float()
    sigma = torch.exp(logs_p)
    sigma = sigma * z_mask
    kl = logs_p - logs_q - 0.5
    kl += 0.5 * ((z_p - m_p)**2) * torch.exp(-2. * logs_p)
    kl += 0.5 * torch.log(2 * torch.pi * sigma**2)  # BUG
    kl = torch.sum(kl * z_mask)
    loss = kl / torch.sum(z_mask)
    return loss


class SynthesizerTrn(nn.Module):
    """Ours: a small stand-in with the outputs of so-vits-svc's SynthesizerTrn."""

    def __init__(self, c_dim=32, spec_channels=40, inter_channels=16):
        super().__init__()
        self.enc_p = nn.Conv1d(c_dim, 2 * inter_channels, 1)
        self.enc_q = nn.Conv1d(spec_channels, 2 * inter_channels, 1)
        self.flow = nn.Conv1d(inter_channels, inter_channels, 1)
        self.dec = nn.Conv1d(inter_channels, spec_channels, 1)

    def forward(self, c, spec, c_lengths, spec_lengths):
        z_mask = sequence_mask(spec_lengths, spec.size(2)).unsqueeze(1).to(spec.dtype)
        m_p, logs_p = (self.enc_p(c) * z_mask).chunk(2, dim=1)
        m_q, logs_q = (self.enc_q(spec) * z_mask).chunk(2, dim=1)
        z = (m_q + torch.randn_like(m_q) * torch.exp(logs_q)) * z_mask
        z_p = self.flow(z) * z_mask
        y_hat = self.dec(z) * z_mask
        return y_hat, z_mask, (z, z_p, m_p, logs_p, m_q, logs_q)


def train_and_evaluate(hps, net_g, optim_g, scaler, train_loader):
    net_g.train()
    for batch_idx, items in enumerate(train_loader):
        c, spec, lengths = items
        with torch.autocast("cpu", enabled=hps["fp16_run"]):
            y_hat, z_mask, (z, z_p, m_p, logs_p, m_q, logs_q) = net_g(c, spec, c_lengths=lengths,
                                                                       spec_lengths=lengths)
            with torch.autocast("cpu", enabled=False):
                loss_mel = F.l1_loss(spec * z_mask, y_hat) * hps["c_mel"]
                loss_kl = kl_loss(z_p, logs_q, m_p, logs_p, z_mask) * hps["c_kl"]
                loss_gen_all = loss_mel + loss_kl
        optim_g.zero_grad()
        scaler.scale(loss_gen_all).backward()
        scaler.unscale_(optim_g)
        grad_norm_g = clip_grad_value_(net_g.parameters(), None)
        scaler.step(optim_g)
        scaler.update()
        print(f"step {batch_idx}: mel {loss_mel.item():.4f} kl {loss_kl.item():.4f} grad_norm {grad_norm_g}")


if __name__ == "__main__":
    torch.manual_seed(1234)
    hps = {"fp16_run": False, "c_mel": 45, "c_kl": 1.0, "learning_rate": 1e-4}
    net_g = SynthesizerTrn()
    optim_g = torch.optim.AdamW(net_g.parameters(), hps["learning_rate"], betas=(0.8, 0.99), eps=1e-9)
    scaler = torch.amp.GradScaler("cpu", enabled=hps["fp16_run"])
    train_loader = []
    for _ in range(6):
        lengths = torch.randint(40, 65, (4,))
        lengths[0] = 64
        c = torch.randn(4, 32, 64) * sequence_mask(lengths, 64).unsqueeze(1)
        spec = torch.randn(4, 40, 64).abs() * sequence_mask(lengths, 64).unsqueeze(1)
        train_loader.append((c, spec, lengths))
    train_and_evaluate(hps, net_g, optim_g, scaler, train_loader)
