# Source: https://github.com/Impavidity/relogic/pull/6
# Original: Impavidity/relogic relogic/logickit/ (the adversarial discriminator and the generator's training step)
# Bug: called without labels the discriminator returned its logits detached (the test-phase path), so the
# adversarial term of the generator's loss carried no gradient: the encoder was trained by the task loss only
# (the author: "the loss from discriminator is missing for generator training because I detach the logits").
import torch
import torch.nn.functional as F

torch.manual_seed(0)


class Discriminator(torch.nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.classifier = torch.nn.Sequential(torch.nn.Linear(hidden, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1))

    def forward(self, features, label_ids=None):
        logits = self.classifier(features).squeeze(-1)
        if label_ids is None:
            return logits.detach()  # BUG
        return logits, F.binary_cross_entropy_with_logits(logits, label_ids)


encoder = torch.nn.Sequential(torch.nn.Linear(24, 32), torch.nn.Tanh())
task_head = torch.nn.Linear(32, 5)
discriminator = Discriminator(32)
gen_optimizer = torch.optim.Adam(list(encoder.parameters()) + list(task_head.parameters()), lr=1e-3)
disc_optimizer = torch.optim.Adam(discriminator.parameters(), lr=1e-3)
adversarial_weight = 0.1

for step in range(60):
    source_x, source_y = torch.randn(16, 24), torch.randint(0, 5, (16,))
    target_x = torch.randn(16, 24) + 0.5
    # generator (encoder + task head): task loss plus fooling the domain discriminator
    src_feat, tgt_feat = encoder(source_x), encoder(target_x)
    task_loss = F.cross_entropy(task_head(src_feat), source_y)
    tgt_logits = discriminator(tgt_feat)
    adv_loss = F.binary_cross_entropy_with_logits(tgt_logits, torch.ones_like(tgt_logits))
    gen_loss = task_loss + adversarial_weight * adv_loss
    gen_optimizer.zero_grad()
    gen_loss.backward()
    gen_optimizer.step()
    # discriminator: source domain = 1, target domain = 0
    feats = torch.cat([src_feat.detach(), tgt_feat.detach()])
    labels = torch.cat([torch.ones(16), torch.zeros(16)])
    _, disc_loss = discriminator(feats, labels)
    disc_optimizer.zero_grad()
    disc_loss.backward()
    disc_optimizer.step()
print("done")
