# Source: https://github.com/ermongroup/ncsn/issues/2
# Original: ermongroup/ncsn runners/anneal_runner.py (AnnealRunner.train, at c4654a2: the periodic test-loss log)
# Bug: every 100 steps the runner puts the score network in eval mode to log the denoising loss on a test batch
# and never puts it back in train mode, so every later training step runs in eval mode. (The original's
# conditional instance norm behaves the same in both modes, as the maintainer noted; this rewrite's score network
# uses BatchNorm, where the mode matters.)
import numpy as np
import torch

torch.manual_seed(0)


class ScoreNet(torch.nn.Module):
    def __init__(self, n_sigmas):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.BatchNorm1d(64), torch.nn.ELU(),
                                       torch.nn.Linear(64, 16))
        self.sigma_emb = torch.nn.Embedding(n_sigmas, 16)

    def forward(self, x, labels):
        return self.net(x + self.sigma_emb(labels))


def anneal_dsm_score_estimation(scorenet, samples, labels, sigmas, anneal_power=2.0):
    used_sigmas = sigmas[labels].view(samples.shape[0], 1)
    perturbed = samples + torch.randn_like(samples) * used_sigmas
    target = -1 / (used_sigmas ** 2) * (perturbed - samples)
    scores = scorenet(perturbed, labels)
    loss = 0.5 * ((scores - target) ** 2).sum(dim=-1) * used_sigmas.squeeze(-1) ** anneal_power
    return loss.mean(dim=0)


class AnnealRunner:
    def __init__(self, n_iters=300, n_sigmas=10):
        self.n_iters, self.n_sigmas = n_iters, n_sigmas

    def train(self, train_batches, test_batches):
        score = ScoreNet(self.n_sigmas)
        optimizer = torch.optim.Adam(score.parameters(), lr=1e-3)
        sigmas = torch.tensor(np.exp(np.linspace(np.log(1.0), np.log(0.01), self.n_sigmas))).float()
        test_iter = iter(test_batches)
        step = 0
        score.train()
        for epoch in range(100):
            for X in train_batches:
                step += 1
                labels = torch.randint(0, len(sigmas), (X.shape[0],))
                loss = anneal_dsm_score_estimation(score, X, labels, sigmas)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                if step >= self.n_iters:
                    return loss.item()
                if step % 100 == 0:
                    score.eval()  # BUG
                    try:
                        test_X = next(test_iter)
                    except StopIteration:
                        test_iter = iter(test_batches)
                        test_X = next(test_iter)
                    test_labels = torch.randint(0, len(sigmas), (test_X.shape[0],))
                    with torch.no_grad():
                        test_dsm_loss = anneal_dsm_score_estimation(score, test_X, test_labels, sigmas)
                    print("step", step, "test_dsm_loss", round(test_dsm_loss.item(), 3))


g = torch.Generator().manual_seed(1)
train_batches = [torch.randn(32, 16, generator=g) * 0.5 + 1.0 for _ in range(40)]
test_batches = [torch.randn(32, 16, generator=g) * 0.5 + 1.0 for _ in range(4)]
print("final loss", round(AnnealRunner().train(train_batches, test_batches), 3))
