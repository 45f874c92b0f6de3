# Source: https://github.com/mpariente/pytorch_stoi/issues/7 (fix: https://github.com/mpariente/pytorch_stoi/pull/8)
# Original: mpariente/pytorch_stoi torch_stoi/stoi.py (NegSTOILoss.forward) used as the training loss of a
# masking enhancer
# Bug: the one-third-octave band energies of the estimate are square-rooted with no epsilon; frames where the
# estimate is exactly zero (the zero padding of short utterances, masked by the model) give sqrt(0), whose
# gradient is infinite, and the backward turns it into NaN gradients on every weight.
import torch
import torch.nn.functional as F

torch.manual_seed(0)
EPS = 1e-8
N = 30
BETA = -15.0


def thirdoct(fs, nfft, num_bands, min_freq):
    f = torch.linspace(0, fs, nfft + 1)[: nfft // 2 + 1]
    k = torch.arange(num_bands, dtype=torch.float32)
    cf = 2 ** (k / 3) * min_freq
    lo = min_freq * 2 ** ((2 * k - 1) / 6)
    hi = min_freq * 2 ** ((2 * k + 1) / 6)
    obm = ((f[None, :] >= lo[:, None]) & (f[None, :] < hi[:, None])).float()
    return obm, cf


def meanvar_norm(x, dim):
    x = x - x.mean(dim=dim, keepdim=True)
    return x / (x.norm(dim=dim, keepdim=True) + EPS)


class NegSTOILoss(torch.nn.Module):
    def __init__(self, sample_rate=10000, win_len=256):
        super().__init__()
        self.win_len, self.nfft = win_len, 2 * win_len
        self.register_buffer("win", torch.hann_window(win_len + 2)[1:-1])
        self.register_buffer("OBM", thirdoct(sample_rate, self.nfft, 15, 150)[0])

    def stft(self, x):
        spec = torch.stft(x, self.nfft, hop_length=self.win_len // 2, win_length=self.win_len, window=self.win,
                          center=False, return_complex=True)
        return spec.abs()

    def forward(self, est_targets, targets):
        x_spec = self.stft(targets)
        y_spec = self.stft(est_targets)
        x_tob = torch.matmul(self.OBM, x_spec.pow(2) + EPS).pow(0.5)
        y_tob = torch.matmul(self.OBM, y_spec.pow(2)).pow(0.5)  # BUG
        batch = targets.shape[0]
        x_seg = F.unfold(x_tob.unsqueeze(2), kernel_size=(1, N)).view(batch, x_tob.shape[1], N, -1)
        y_seg = F.unfold(y_tob.unsqueeze(2), kernel_size=(1, N)).view(batch, y_tob.shape[1], N, -1)
        norm_const = x_seg.norm(dim=2, keepdim=True) / (y_seg.norm(dim=2, keepdim=True) + EPS)
        y_prim = torch.min(y_seg * norm_const, x_seg * (1 + 10 ** (-BETA / 20)))
        corr = meanvar_norm(y_prim, dim=2) * meanvar_norm(x_seg, dim=2)
        return -corr.sum(dim=(1, 2, 3)) / (x_seg.shape[1] * x_seg.shape[-1])


class MaskNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Conv1d(1, 16, 31, padding=15), torch.nn.ReLU(),
                                       torch.nn.Conv1d(16, 1, 31, padding=15))

    def forward(self, mixture):
        return mixture * torch.sigmoid(self.net(mixture.unsqueeze(1))).squeeze(1)


def make_batch(batch=4, length=8000):
    clean = torch.zeros(batch, length)
    for b in range(batch):
        n = int(torch.randint(4000, length, ()))
        t = torch.arange(n) / 10000
        clean[b, :n] = torch.sin(2 * torch.pi * (200 + 300 * b) * t) * (1 + torch.sin(2 * torch.pi * 3 * t))
    noise = 0.3 * torch.randn_like(clean) * (clean != 0)
    return clean + noise, clean


model = MaskNet()
loss_func = NegSTOILoss()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
for step in range(12):
    mixture, clean = make_batch()
    est = model(mixture)
    loss = loss_func(est, clean).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step % 4 == 0:
        print("step", step, "loss", loss.item())
