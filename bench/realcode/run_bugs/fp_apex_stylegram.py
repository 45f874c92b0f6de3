# Source: https://github.com/NVIDIA/apex/issues/402
# Original: a fast-neural-style training loop under mixed precision (the gram_matrix helper of the style loss,
# as in pytorch/examples fast_neural_style/utils.py and leongatys/PytorchNeuralStyleTransfer GramMatrix)
# Bug: under float16 autocast the Gram matrix's bmm runs in half precision; features of a loss network fed
# 0-255 images sum to far more than 65504 over h*w positions, every Gram entry is inf and the style loss is nan
# (the maintainer's advice: keep that op out of the casts, i.e. compute the Gram matrix in float32).
import torch
import torch.nn.functional as F

torch.manual_seed(0)
MEAN = torch.tensor([103.939, 116.779, 123.68]).view(1, 3, 1, 1)


def gram_matrix(y):
    b, ch, h, w = y.size()
    features = y.view(b, ch, w * h)
    gram = features.bmm(features.transpose(1, 2))  # BUG
    return gram / (ch * h * w)


class TransformerNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.InstanceNorm2d(16, affine=True), torch.nn.ReLU(),
            torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.InstanceNorm2d(32, affine=True), torch.nn.ReLU(),
            torch.nn.Conv2d(32, 3, 3, padding=1))

    def forward(self, x):
        return self.net(x)


class LossNet(torch.nn.Module):
    """Stands for the frozen caffe VGG16 (relu1_2, relu2_2), which takes mean-subtracted 0-255 images."""

    def __init__(self):
        super().__init__()
        self.slice1 = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(),
                                          torch.nn.Conv2d(32, 32, 3, padding=1), torch.nn.ReLU())
        self.slice2 = torch.nn.Sequential(torch.nn.MaxPool2d(2), torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU())
        for p in self.parameters():
            p.requires_grad_(False)

    def forward(self, x):
        h1 = self.slice1(x - MEAN)
        return h1, self.slice2(h1)


transformer, vgg = TransformerNet(), LossNet()
optimizer = torch.optim.Adam(transformer.parameters(), lr=1e-3)
scaler = torch.amp.GradScaler("cpu")
style = torch.rand(1, 3, 32, 32) * 255
with torch.autocast("cpu", dtype=torch.float16):
    gram_style = [gram_matrix(f) for f in vgg(style)]
for step in range(10):
    x = torch.rand(2, 3, 32, 32) * 255
    optimizer.zero_grad()
    with torch.autocast("cpu", dtype=torch.float16):
        y = transformer(x)
        features_y, features_x = vgg(y), vgg(x)
        content_loss = F.mse_loss(features_y[1].float(), features_x[1].float())
        style_loss = sum(F.mse_loss(gram_matrix(fy).float(), gs.float().expand(len(x), -1, -1))
                         for fy, gs in zip(features_y, gram_style))
        loss = content_loss + 10.0 * style_loss
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    if step % 3 == 0:
        print(step, "content", content_loss.item(), "style", style_loss.item(), "scale", scaler.get_scale())
