# Source: https://github.com/TRI-ML/packnet-sfm/pull/51
# Original: TRI-ML/packnet-sfm packnet_sfm/trainers/horovod_trainer.py (HorovodTrainer.train)
# Bug: each step's output dict, whose 'loss' still holds its autograd graph, is appended to an epoch-long
# list, keeping every step's graph alive.
import torch

torch.manual_seed(0)


class Module(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.depth = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 1, 1))

    def training_step(self, batch):
        pred = self.depth(batch["rgb"])
        loss = (pred - batch["depth"]).abs().mean()
        return {"loss": loss, "metrics": {"abs": loss.detach()}}


def train(dataloader, module, optimizer):
    module.train()
    outputs = []
    for i, batch in enumerate(dataloader):
        optimizer.zero_grad()
        output = module.training_step(batch)
        output["loss"].backward()
        optimizer.step()
        outputs.append(output)  # BUG
    return outputs


module = Module()
optimizer = torch.optim.Adam(module.parameters(), lr=2e-4)
dataloader = [{"rgb": torch.randn(2, 3, 16, 16), "depth": torch.rand(2, 1, 16, 16)} for _ in range(60)]
for epoch in range(2):
    outs = train(dataloader, module, optimizer)
    print("epoch", epoch, len(outs))
