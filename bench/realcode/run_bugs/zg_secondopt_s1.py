# Source: synthetic: state 1 of run15miss
# Original: none (our own script; an autoencoder with one optimizer per half)
# Bug: only the encoder's optimizer is cleared; the decoder's optimizer steps every batch on summed gradients.
import torch
from torch import nn

torch.manual_seed(0)
encoder = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
decoder = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 16))
opt_enc = torch.optim.Adam(encoder.parameters(), lr=1e-3)
opt_dec = torch.optim.Adam(decoder.parameters(), lr=1e-3)
loader = torch.utils.data.DataLoader(torch.randn(320, 16), batch_size=8, shuffle=True)
for epoch in range(2):
    for x in loader:
        opt_enc.zero_grad()
        recon = decoder(encoder(x))
        loss = nn.functional.mse_loss(recon, x)
        loss.backward()  # BUG
        opt_enc.step()
        opt_dec.step()
    print("epoch", epoch, loss.item())
