# Source: https://github.com/guopengf/FL-MRCM/issues/10
# Original: guopengf/FL-MRCM models/recon_Update.py (LocalUpdate_ad_da.train)
# Bug: the generator's adversarial loss is turned into a Python float (detach().item()) and then added to
# the L1 loss that is backpropagated, so the adversarial term contributes no gradient.
import torch
import torch.nn.functional as F

torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 1, 3, padding=1))
FD = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, stride=2), torch.nn.Flatten(), torch.nn.Linear(4 * 7 * 7, 1))
optimizer = torch.optim.RMSprop(net.parameters(), lr=1e-3)
optimizer_fd = torch.optim.Adam(FD.parameters(), lr=1e-4)

for it in range(40):
    inp, target = torch.randn(4, 1, 16, 16), torch.randn(4, 1, 16, 16)
    output = net(inp)
    # discriminator on features of the source and target sites
    optimizer_fd.zero_grad()
    loss_fd = F.binary_cross_entropy_with_logits(FD(output.detach()), torch.zeros(4, 1)) + \
        F.binary_cross_entropy_with_logits(FD(target), torch.ones(4, 1))
    loss_fd.backward()
    optimizer_fd.step()
    # reconstruction network
    loss_adv = F.binary_cross_entropy_with_logits(FD(output), torch.ones(4, 1)).detach().item()  # BUG
    loss = F.l1_loss(output, target) + 0.01 * loss_adv
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("done")
