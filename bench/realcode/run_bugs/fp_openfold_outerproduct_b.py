# Source: https://github.com/aqlaboratory/openfold/pull/222
# Original: aqlaboratory/openfold openfold/model/outer_product_mean.py (OuterProductMean._opm, forward), read at
# aef97f4^ (the PR's first commit, "convert suspicious fp16 regions back to fp32")
# Bug: under fp16 autocast the outer product mean contracts the two MSA projections over every sequence of the MSA
# in float16 (einsum -> bmm), and only divides by the sequence count afterwards; for a deep MSA of near-identical
# homologous rows the sum leaves the float16 range (65504), the pair update is inf and the loss nan. The fix runs the
# module in fp32 with autocast off. Ours: a one-block model (MSA embedding -> outer product mean -> distogram head),
# synthetic MSAs, and projection weights scaled x3 as a stand-in for a trained checkpoint (the trigger is ours).
import torch
from torch import nn

torch.manual_seed(0)
N_SEQ, N_RES, C_M, C_HIDDEN, C_Z, NO_BINS = 1024, 16, 32, 32, 16, 16


class OuterProductMean(nn.Module):
    def __init__(self, c_m, c_z, c_hidden, eps=1e-3):
        super().__init__()
        self.eps = eps
        self.layer_norm = nn.LayerNorm(c_m)
        self.linear_1 = nn.Linear(c_m, c_hidden)
        self.linear_2 = nn.Linear(c_m, c_hidden)
        self.linear_out = nn.Linear(c_hidden**2, c_z)
        with torch.no_grad():  # stands in for trained weights, larger than at initialisation
            self.linear_1.weight.normal_(std=3 * c_m**-0.5)
            self.linear_2.weight.normal_(std=3 * c_m**-0.5)

    def _opm(self, a, b):
        # [*, N_res, N_res, C, C]
        outer = torch.einsum("...bac,...dae->...bdce", a, b)  # BUG
        outer = outer.reshape(outer.shape[:-2] + (-1,))
        return self.linear_out(outer)

    def forward(self, m, mask=None):
        if mask is None:
            mask = m.new_ones(m.shape[:-1])
        ln = self.layer_norm(m)
        mask = mask.unsqueeze(-1)
        a = self.linear_1(ln) * mask
        b = self.linear_2(ln) * mask
        a = a.transpose(-2, -3)
        b = b.transpose(-2, -3)
        outer = self._opm(a, b)
        norm = torch.einsum("...abc,...adc->...bdc", mask, mask) + self.eps
        return outer / norm


class DistogramHead(nn.Module):
    def __init__(self, c_z, no_bins):
        super().__init__()
        self.linear = nn.Linear(c_z, no_bins)

    def forward(self, z):
        logits = self.linear(z)
        return logits + logits.transpose(-2, -3)


class TinyFold(nn.Module):
    def __init__(self):
        super().__init__()
        self.msa_embedder = nn.Linear(23, C_M)
        self.opm = OuterProductMean(C_M, C_Z, C_HIDDEN)
        self.distogram = DistogramHead(C_Z, NO_BINS)

    def forward(self, msa_feat):
        m = self.msa_embedder(msa_feat)
        z = self.opm(m)
        return self.distogram(z)


def sample_msa():
    """A query of N_RES residues and N_SEQ homologues that differ from it at ~5% of positions."""
    query = torch.randint(0, 23, (N_RES,))
    msa = query.expand(N_SEQ, N_RES).clone()
    mutate = torch.rand(N_SEQ, N_RES) < 0.05
    msa[mutate] = torch.randint(0, 23, (int(mutate.sum()),))
    coords = torch.randn(N_RES, 3) * 4
    bins = (torch.cdist(coords, coords) / 2).long().clamp(max=NO_BINS - 1)
    return nn.functional.one_hot(msa, 23).float(), bins


model = TinyFold()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
scaler = torch.amp.GradScaler("cpu")
for step in range(12):
    msa_feat, bins = sample_msa()
    with torch.autocast("cpu", dtype=torch.float16):
        logits = model(msa_feat)
        loss = nn.functional.cross_entropy(logits.float().reshape(-1, NO_BINS), bins.reshape(-1))
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    print(f"step {step} loss {loss.item():.4f} scale {scaler.get_scale():.0f}")
