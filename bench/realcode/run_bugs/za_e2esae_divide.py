# Source: https://github.com/ApolloResearch/e2e_sae/pull/70
# Original: ApolloResearch/e2e_sae e2e_sae/scripts/train_tlens_saes/run_train_tlens_saes.py (train loop)
# Bug: #68 removed the division of each micro-batch loss by gradient_accumulation_steps; the losses are means,
# so the accumulated gradient is gradient_accumulation_steps times the intended one (#70 put it back).
import torch
import torch.nn.functional as F

torch.manual_seed(0)


class SAE(torch.nn.Module):
    def __init__(self, d_model, n_dict):
        super().__init__()
        self.encoder = torch.nn.Linear(d_model, n_dict)
        self.decoder = torch.nn.Linear(n_dict, d_model, bias=False)

    def forward(self, x):
        c = F.relu(self.encoder(x))
        return self.decoder(c), c


def calc_loss(orig_acts, sae_out, sae_c, sparsity_coeff):
    loss_dict = {
        "in_to_orig": F.mse_loss(sae_out, orig_acts),
        "sparsity": sae_c.abs().sum(-1).mean(),
    }
    loss = loss_dict["in_to_orig"] + sparsity_coeff * loss_dict["sparsity"]
    return loss, loss_dict


tlens_model = torch.nn.Sequential(torch.nn.Embedding(100, 24), torch.nn.Linear(24, 24))
for p in tlens_model.parameters():
    p.requires_grad_(False)
sae = SAE(24, 96)
optimizer = torch.optim.Adam(sae.parameters(), lr=1e-3)
gradient_accumulation_steps = 4
batches = [torch.randint(0, 100, (8, 16)) for _ in range(96)]
for batch_idx, tokens in enumerate(batches):
    with torch.no_grad():
        orig_acts = tlens_model(tokens)
    sae_out, sae_c = sae(orig_acts)
    loss, loss_dict = calc_loss(orig_acts, sae_out, sae_c, sparsity_coeff=1e-3)
    loss.backward()  # BUG
    if (batch_idx + 1) % gradient_accumulation_steps == 0:
        torch.nn.utils.clip_grad_norm_(sae.parameters(), 10.0)
        optimizer.step()
        optimizer.zero_grad()
    if batch_idx % 32 == 0:
        print(batch_idx, {k: round(v.item(), 4) for k, v in loss_dict.items()})
