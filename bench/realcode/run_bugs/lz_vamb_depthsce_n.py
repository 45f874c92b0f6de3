"""Vamb's VAE whose depth cross-entropy takes the log of a softmax that reaches exactly 0.

Source: https://github.com/RasmussenLab/vamb/issues/12 ("nan's after some epochs"; the maintainer traced
it to a depth probability of exactly 0.0 in the cross entropy and fixed it on master by adding 1e-9)
Original: RasmussenLab/vamb vamb/encode.py (VAE._decode: softmax over the sample depths; VAE.calc_loss;
VAE.trainepoch), written in its layout as it was before the fix (`depths_out.log()` without the
pseudocount); the fixed line is read in the current file and in several forks.
Bug: for a contig that is absent from a sample the decoder drives that sample's softmax probability to
exactly 0.0 in float32; log(0) is -inf and 0 * -inf is nan, so the loss and every gradient become nan.
Ours: random depth and TNF vectors (one sample empty for every contig) and a small encoder/decoder; the
decoder bias of the empty sample starts at -110, a stand-in for a decoder that has already learned
the sample is empty, so the underflow shows in one short run; CPU.
"""
from math import log as _log

import torch
import torch.nn as nn
from torch.nn.functional import softmax as _softmax

torch.manual_seed(0)


class VAE(nn.Module):
    def __init__(self, nsamples, ntnf=103, nhiddens=(64, 64), nlatent=16, alpha=0.15, beta=200):
        super().__init__()
        self.nsamples = nsamples
        self.ntnf = ntnf
        self.alpha = alpha
        self.beta = beta
        self.nlatent = nlatent
        self.encoderlayers = nn.ModuleList()
        self.encodernorms = nn.ModuleList()
        self.decoderlayers = nn.ModuleList()
        self.decodernorms = nn.ModuleList()
        for nin, nout in zip([nsamples + ntnf] + list(nhiddens), nhiddens):
            self.encoderlayers.append(nn.Linear(nin, nout))
            self.encodernorms.append(nn.BatchNorm1d(nout))
        self.mu = nn.Linear(nhiddens[-1], nlatent)
        self.logsigma = nn.Linear(nhiddens[-1], nlatent)
        for nin, nout in zip([nlatent] + list(reversed(nhiddens)), reversed(nhiddens)):
            self.decoderlayers.append(nn.Linear(nin, nout))
            self.decodernorms.append(nn.BatchNorm1d(nout))
        self.outputlayer = nn.Linear(nhiddens[0], nsamples + ntnf)
        self.relu = nn.LeakyReLU()

    def _encode(self, tensor):
        for encoderlayer, encodernorm in zip(self.encoderlayers, self.encodernorms):
            tensor = encodernorm(self.relu(encoderlayer(tensor)))
        return self.mu(tensor), self.logsigma(tensor)

    def reparameterize(self, mu, logsigma):
        epsilon = torch.randn(mu.size(0), mu.size(1))
        return mu + epsilon * torch.exp(logsigma / 2)

    def _decode(self, tensor):
        for decoderlayer, decodernorm in zip(self.decoderlayers, self.decodernorms):
            tensor = decodernorm(self.relu(decoderlayer(tensor)))
        reconstruction = self.outputlayer(tensor)
        depths_out = reconstruction.narrow(1, 0, self.nsamples)
        tnf_out = reconstruction.narrow(1, self.nsamples, self.ntnf)
        if self.nsamples > 1:
            depths_out = _softmax(depths_out, dim=1)
        return depths_out, tnf_out

    def forward(self, depths, tnf):
        tensor = torch.cat((depths, tnf), 1)
        mu, logsigma = self._encode(tensor)
        latent = self.reparameterize(mu, logsigma)
        depths_out, tnf_out = self._decode(latent)
        return depths_out, tnf_out, mu, logsigma

    def calc_loss(self, depths_in, depths_out, tnf_in, tnf_out, mu, logsigma):
        if self.nsamples > 1:
            ce = - (depths_out.log() * depths_in).sum(dim=1).mean()  # BUG
            ce_weight = (1 - self.alpha) / _log(self.nsamples)
        else:
            ce = (depths_out - depths_in).pow(2).sum(dim=1).mean()
            ce_weight = 1 - self.alpha
        sse = (tnf_out - tnf_in).pow(2).sum(dim=1).mean()
        kld = -0.5 * (1 + logsigma - mu.pow(2) - logsigma.exp()).sum(dim=1).mean()
        sse_weight = self.alpha / self.ntnf
        kld_weight = 1 / (self.nlatent * self.beta)
        loss = ce * ce_weight + sse * sse_weight + kld * kld_weight
        return loss, ce, sse, kld

    def trainepoch(self, data_loader, epoch, optimizer):
        self.train()
        epoch_loss = 0
        for depths_in, tnf_in in data_loader:
            depths_in.requires_grad = True
            tnf_in.requires_grad = True
            optimizer.zero_grad()
            depths_out, tnf_out, mu, logsigma = self(depths_in, tnf_in)
            loss, ce, sse, kld = self.calc_loss(depths_in, depths_out, tnf_in, tnf_out, mu, logsigma)
            loss.backward()
            optimizer.step()
            epoch_loss += loss.data.item()
        print(f"\tEpoch: {epoch + 1}\tLoss: {epoch_loss / len(data_loader):.6f}")


nsamples, ncontigs = 6, 512
depths = torch.rand(ncontigs, nsamples)
depths[:, -1] = 0.0  # the last sample holds none of these contigs
depths = depths / depths.sum(dim=1, keepdim=True)
tnf = torch.randn(ncontigs, 103)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(depths, tnf), batch_size=64, shuffle=True, drop_last=True)

vae = VAE(nsamples)
with torch.no_grad():
    vae.outputlayer.bias[nsamples - 1] = -110.0
optimizer = torch.optim.Adam(vae.parameters(), lr=1e-3)
for epoch in range(3):
    vae.trainepoch(loader, epoch, optimizer)
