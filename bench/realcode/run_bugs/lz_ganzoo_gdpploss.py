# Source: https://github.com/facebookresearch/pytorch_GAN_zoo/issues/89
# Original: facebookresearch/pytorch_GAN_zoo models/loss_criterions/GDPP_loss.py (GDPPLoss.normalize_min_max)
# Bug: the min-max normalisation of the real eigenvalues divides by max - min; when all eigenvalues are equal (a
# batch of one at the end of an epoch) that is 0/0 and the generator's loss, and then its weights, turn nan.
import torch
import torch.nn.functional as F

torch.manual_seed(0)


def GDPPLoss(phiFake, phiReal):
    def compute_diversity(phi):
        phi = F.normalize(phi, p=2, dim=1)
        sb = torch.mm(phi, phi.t())
        eig_vals, eig_vecs = torch.linalg.eigh(sb)
        return eig_vals, eig_vecs

    def normalize_min_max(eig_vals):
        min_v, max_v = torch.min(eig_vals), torch.max(eig_vals)
        return (eig_vals - min_v) / (max_v - min_v)  # BUG

    fake_vals, fake_vecs = compute_diversity(phiFake)
    real_vals, real_vecs = compute_diversity(phiReal)
    magnitude_loss = 0.0001 * F.mse_loss(target=real_vals, input=fake_vals)
    structure_loss = -torch.sum(torch.mul(fake_vecs, real_vecs), 0)
    normalized_real = normalize_min_max(real_vals)
    weighted_structure_loss = torch.sum(torch.mul(normalized_real, structure_loss))
    return magnitude_loss + weighted_structure_loss


generator = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32))
features = torch.nn.Sequential(torch.nn.Linear(32, 24), torch.nn.LeakyReLU(0.2))  # the discriminator's feature layer
for p in features.parameters():
    p.requires_grad_(False)
optimizer = torch.optim.Adam(generator.parameters(), lr=1e-4, betas=(0.0, 0.99))
real_data = torch.randn(57, 32)
for epoch in range(3):
    for start in range(0, len(real_data), 8):  # 57 samples in batches of 8: the last batch holds one
        real = real_data[start:start + 8]
        fake = generator(torch.randn(real.size(0), 16))
        loss = F.mse_loss(fake.mean(0), real.mean(0)) + GDPPLoss(features(fake), features(real))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print("epoch", epoch, "loss", loss.item())
