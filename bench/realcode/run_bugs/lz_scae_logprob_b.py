# Source: https://github.com/mlberkeley/scae-pytorch/pull/4
# Original: mlberkeley/scae-pytorch scae/util/math.py (MixtureDistribution.log_prob), the pixel mixture that
# TemplateImageDecoder in scae/modules/part_capsule_ae.py returns
# Bug: the mixture log-likelihood is computed as log(sum(exp(log_prob))) with plain exp and log; a template pixel
# far from every component underflows exp to 0, the log returns -inf and the loss and its gradients turn nan
# (the PR replaced it with torch.logsumexp).
import math

import torch

torch.manual_seed(0)
n_templates, img = 4, 10


class TemplateMixture:
    def __init__(self, means, scale, mixing_logits):
        self.means = means
        self.scale = scale
        self.mixing_logits = mixing_logits

    def log_prob(self, x):
        x = x.unsqueeze(1)
        var = self.scale.pow(2)
        component = -0.5 * (x - self.means).pow(2) / var - torch.log(self.scale) - 0.5 * math.log(2 * math.pi)
        log_mix = torch.log_softmax(self.mixing_logits, dim=1)
        return torch.log(torch.exp(component + log_mix).sum(1))  # BUG


class PartDecoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.templates = torch.nn.Parameter(torch.rand(n_templates, img * img))
        self.presence = torch.nn.Linear(16, n_templates)
        self.log_scale = torch.nn.Parameter(torch.tensor(-2.0))

    def forward(self, pose):
        logits = self.presence(pose).unsqueeze(-1).expand(-1, -1, img * img)
        means = self.templates.unsqueeze(0)
        return TemplateMixture(means, self.log_scale.exp(), logits)


encoder = torch.nn.Sequential(torch.nn.Linear(img * img, 64), torch.nn.ReLU(), torch.nn.Linear(64, 16))
decoder = PartDecoder()
optimizer = torch.optim.Adam(list(encoder.parameters()) + list(decoder.parameters()), lr=1e-3)
for step in range(50):
    images = torch.rand(32, img * img)
    images[:, :5] += 3.0
    rec = decoder(encoder(images))
    loss = -rec.log_prob(images).sum(-1).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step % 10 == 0:
        print(step, loss.item())
