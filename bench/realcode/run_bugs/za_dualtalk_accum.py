# Source: https://github.com/ZiqiaoPeng/DualTalk/issues/9
# Original: ZiqiaoPeng/DualTalk main.py (trainer: the batch loop with gradient_accumulation_steps)
# Bug: the batch loop zeroes the gradients before every backward, but steps the optimizer only every
# gradient_accumulation_steps batches, so each step applies the last batch's gradient alone and the other
# batches' backwards are thrown away. (The issue quotes the lines; the talking-head model here is a small
# stand-in of ours.)
import torch

torch.manual_seed(0)


class TalkingHead(torch.nn.Module):
    def __init__(self, audio_dim=24, vert_dim=30):
        super().__init__()
        self.audio_enc = torch.nn.GRU(audio_dim, 32, batch_first=True)
        self.decoder = torch.nn.Linear(32 + vert_dim, vert_dim)

    def forward(self, audio, template):
        h, _ = self.audio_enc(audio)
        return template[:, None, :] + self.decoder(torch.cat([h, template[:, None, :].expand(-1, h.shape[1], -1)], -1))


def trainer(args, train_loader, model, optimizer, criterion, epoch=4):
    iteration = 0
    for e in range(epoch):
        loss_log = []
        model.train()
        optimizer.zero_grad()
        for i, (audio, vertice, template) in enumerate(train_loader):
            iteration += 1
            loss = criterion(model(audio, template), vertice)
            optimizer.zero_grad()  # BUG
            loss.backward()
            loss_log.append(loss.item())
            if i % args["gradient_accumulation_steps"] == 0:
                optimizer.step()
                optimizer.zero_grad()
        print("epoch", e + 1, "iteration", iteration, "loss %.5f" % (sum(loss_log) / len(loss_log)))


g = torch.Generator().manual_seed(1)
train_loader = [(torch.randn(2, 20, 24, generator=g), torch.randn(2, 20, 30, generator=g) * 0.1,
                 torch.randn(2, 30, generator=g) * 0.1) for _ in range(24)]
model = TalkingHead()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
trainer({"gradient_accumulation_steps": 4}, train_loader, model, optimizer, torch.nn.MSELoss())
