# Source: https://github.com/e3nn/e3nn/pull/258
# Original: e3nn/e3nn e3nn/nn/_normact.py (NormActivation) and e3nn/o3/_norm.py (Norm)
# Bug: the norm gate computes each vector feature's norm as a plain square root and adds epsilon only after it;
# a feature that is exactly zero (an atom with no neighbour inside the cutoff has no directional feature) has
# norm 0, sqrt's gradient there is infinite, and the backward fills every weight with NaN.
import torch

torch.manual_seed(0)


class NormActivation(torch.nn.Module):
    """Scales each 3-vector channel by act(|v| + b) / |v|: rotation-equivariant, like e3nn's norm gate."""

    def __init__(self, channels, epsilon=1e-8):
        super().__init__()
        self.bias = torch.nn.Parameter(torch.zeros(channels))
        self.epsilon = epsilon

    def forward(self, vectors):
        norms = vectors.pow(2).sum(-1).sqrt()  # BUG
        norms = norms + self.epsilon
        scale = torch.sigmoid(norms + self.bias) / norms
        return vectors * scale.unsqueeze(-1)


class TinyEquivariantNet(torch.nn.Module):
    def __init__(self, channels=8, cutoff=1.5):
        super().__init__()
        self.cutoff = cutoff
        self.radial = torch.nn.Sequential(torch.nn.Linear(1, 16), torch.nn.SiLU(), torch.nn.Linear(16, channels))
        self.gate = NormActivation(channels)
        self.mix = torch.nn.Linear(channels, channels, bias=False)
        self.readout = torch.nn.Linear(channels, 1)

    def forward(self, pos):
        rel = pos[:, None, :] - pos[None, :, :]
        dist = rel.norm(dim=-1, keepdim=True).clamp(min=1e-6)
        inside = ((dist < self.cutoff) & (dist > 1e-5)).float()
        weights = self.radial(dist) * inside
        vectors = torch.einsum("ijc,ijd->icd", weights, rel / dist)
        vectors = self.gate(vectors)
        vectors = self.mix(vectors.transpose(1, 2)).transpose(1, 2)
        energy = self.readout(vectors.pow(2).sum(-1)).sum()
        return energy


def random_molecule(n=6):
    pos = torch.randn(n, 3)
    if torch.rand(()) < 0.4:
        pos[-1] = torch.tensor([10.0, 10.0, 10.0])  # a far-away atom: no neighbour inside the cutoff
    return pos


model = TinyEquivariantNet()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
for step in range(40):
    pos = random_molecule()
    target = torch.randn(())
    loss = (model(pos) - target).pow(2)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step % 10 == 0:
        print("step", step, "loss", loss.item())
