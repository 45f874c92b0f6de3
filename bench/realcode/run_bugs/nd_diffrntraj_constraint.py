# Source: https://github.com/wtl52656/Diff-RNTraj/issues/9
# Original: wtl52656/Diff-RNTraj diff_util.py (diff_forward_x0_constraint), models/diff_module.py (Diff_RNTraj.forward)
# and the training loop of multi_main.py
# Bug: the road-connectivity term L3 (Eq. 21) is built from an argmax of the denoised embeddings and a comparison
# with the graph's 1e-10 entries, then summed and cast to float: it has no grad_fn and requires_grad False, so the
# weighted constraint in the training loss contributes nothing to any parameter (the issue prints both).
import torch
import torch.nn as nn

torch.manual_seed(0)
N_ROADS, EMB, SEQ_LEN, T_STEPS = 40, 16, 12, 50


def std_normal(size):
    return torch.normal(0, 1, size=size)


def diff_forward_x0_constraint(net, x, diffusion_hyperparams, SE, spatial_A_trans):
    _dh = diffusion_hyperparams
    T, Alpha_bar = _dh["T"], _dh["alpha_bar"]
    B, C, L = x.shape
    diffusion_steps = torch.randint(T, size=(B, 1, 1))
    z = std_normal(x.shape)
    xt = torch.sqrt(Alpha_bar[diffusion_steps]) * x + torch.sqrt(1 - Alpha_bar[diffusion_steps]) * z
    pred_noise = net(xt, diffusion_steps.view(B, 1))
    noise_func = nn.MSELoss()
    xt_noise = noise_func(pred_noise, z)

    x0_hat = (xt - torch.sqrt(1 - Alpha_bar[diffusion_steps]) * pred_noise) / torch.sqrt(Alpha_bar[diffusion_steps])
    x0_hat = x0_hat[:, :, :L - 1]  # B, T, F
    x0_loss = noise_func(x0_hat, x[:, :, :L - 1])

    id_sim = torch.einsum("btf,nf->btn", x0_hat, SE)
    id_sim = id_sim.argmax(-1)
    mask = spatial_A_trans[id_sim[:, :-1], id_sim[:, 1:]] == 1e-10
    loss = torch.sum(mask).float()  # BUG
    return xt_noise, loss, x0_loss


class DenoiseNet(nn.Module):
    def __init__(self, dim, T):
        super().__init__()
        self.step_emb = nn.Embedding(T, 32)
        self.inp = nn.Linear(dim, 32)
        self.mix = nn.GRU(32, 32, batch_first=True, bidirectional=True)
        self.out = nn.Linear(64, dim)

    def forward(self, xt, steps):
        h = self.inp(xt) + self.step_emb(steps)
        h, _ = self.mix(h)
        return self.out(h)


class Diff_RNTraj(nn.Module):
    def __init__(self, diff_model, diffusion_hyperparams):
        super().__init__()
        self.diff_model = diff_model
        self.diffusion_param = diffusion_hyperparams

    def forward(self, spatial_A_trans, SE, src_eid_seqs, src_rate_seqs):
        id_embed = SE[src_eid_seqs]  # B, T, d
        input_data = torch.cat((id_embed, src_rate_seqs.unsqueeze(-1)), -1)  # B, T, d+1
        return diff_forward_x0_constraint(self.diff_model, input_data, self.diffusion_param, SE, spatial_A_trans)


def road_graph():
    """A ring of roads with a few shortcuts; 1 for a legal transition, 1e-10 otherwise (the UTGraph convention)."""
    A = torch.full((N_ROADS, N_ROADS), 1e-10)
    for i in range(N_ROADS):
        for j in (i, (i + 1) % N_ROADS, (i + 7) % N_ROADS):
            A[i, j] = 1.0
    return A


def random_trajectories(n, A):
    seqs = torch.zeros(n, SEQ_LEN, dtype=torch.long)
    seqs[:, 0] = torch.randint(0, N_ROADS, (n,))
    for t in range(1, SEQ_LEN):
        nxt = torch.multinomial((A[seqs[:, t - 1]] > 0.5).float(), 1).squeeze(1)
        seqs[:, t] = nxt
    return seqs, torch.rand(n, SEQ_LEN)


beta = torch.linspace(1e-4, 0.05, T_STEPS)
alpha = 1 - beta
diffusion_hyperparams = {"T": T_STEPS, "alpha": alpha, "alpha_bar": torch.cumprod(alpha, 0)}
spatial_A_trans = road_graph()
SE = torch.randn(N_ROADS, EMB) / EMB ** 0.5
eids, rates = random_trajectories(512, spatial_A_trans)
model = Diff_RNTraj(DenoiseNet(EMB + 1, T_STEPS), diffusion_hyperparams)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
const_weight = 0.1
for epoch in range(4):
    perm = torch.randperm(len(eids))
    for i in range(0, len(eids), 32):
        idx = perm[i:i + 32]
        diff_loss, const_loss, x0_loss = model(spatial_A_trans, SE, eids[idx], rates[idx])
        loss = diff_loss + const_weight * const_loss + x0_loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"epoch {epoch} diff {diff_loss.item():.4f} const {const_loss.item():.0f} x0 {x0_loss.item():.4f}")
