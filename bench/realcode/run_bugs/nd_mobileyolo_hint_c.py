# Source: https://github.com/Syencil/mobile-yolov5-pruning-distillation/issues/83 (fixed in
# Syencil/mobile-yolov5-pruning-distillation@01a0900 "fix some grad bugs"; the README notes the earlier bug)
# Original: Syencil/mobile-yolov5-pruning-distillation train.py (the distillation branch of the batch loop, the
# forward hooks that collect features) and utils/utils.py (compute_distillation_feature_loss)
# Bug: the student's hooked features go through their converters inside the teacher's torch.no_grad() block,
# so the feature-hint loss is a constant: the student backbone gets no gradient from it and feature
# distillation has no effect (only the output distillation trains the student).
import torch
import torch.nn.functional as F

torch.manual_seed(0)


def conv(c1, c2, s=1):
    return torch.nn.Sequential(torch.nn.Conv2d(c1, c2, 3, s, 1, bias=False), torch.nn.BatchNorm2d(c2),
                               torch.nn.ReLU6())


class TinyDetector(torch.nn.Module):
    def __init__(self, widths, no=9):
        super().__init__()
        self.model = torch.nn.Sequential(conv(3, widths[0], 2), conv(widths[0], widths[1], 2),
                                         conv(widths[1], widths[2], 2))
        self.head = torch.nn.Conv2d(widths[2], no, 1)

    def forward(self, x):
        return self.head(self.model(x))


def compute_loss(pred, targets):
    lobj = F.binary_cross_entropy_with_logits(pred[:, 0], targets[:, 0])
    lbox = F.mse_loss(pred[:, 1:5].sigmoid(), targets[:, 1:5])
    return lobj + lbox


def compute_distillation_output_loss(pred, t_pred, loss, h):
    return loss + h["dist"] * F.mse_loss(pred.sigmoid(), t_pred.sigmoid())


def compute_distillation_feature_loss(s_f, t_f, loss, h):
    dl = torch.zeros(1)
    for s, t in zip(s_f, t_f):
        dl += F.mse_loss(s, t)
    dl *= h["dist"] / 2
    return loss + dl * s_f[0].shape[0]


def train(hyp, opt, epochs=3, nb=15):
    model = TinyDetector((8, 16, 32))
    t_model = TinyDetector((16, 32, 64)).eval()
    optimizer = torch.optim.SGD(model.parameters(), lr=hyp["lr0"], momentum=hyp["momentum"], nesterov=True)
    activation = {}

    def get_activation(name):
        def hook(model, inputs, outputs):
            activation[name] = outputs
        return hook

    for i, (s_name, t_name) in enumerate((("s_f1", "t_f1"), ("s_f2", "t_f2"), ("s_f3", "t_f3"))):
        model.model[i].register_forward_hook(get_activation(s_name))
        t_model.model[i].register_forward_hook(get_activation(t_name))
    S_Converter = [conv(c, c) for c in (8, 16, 32)]
    T_Converter = [torch.nn.Conv2d(c2, c1, 1) for c1, c2 in ((8, 16), (16, 32), (32, 64))]
    for epoch in range(epochs):
        model.train()
        for i in range(nb):
            imgs = torch.rand(8, 3, 32, 32)
            targets = torch.rand(8, 5, 4, 4)
            targets[:, 0] = (targets[:, 0] > 0.8).float()
            pred = model(imgs)
            if opt["dist"]:
                with torch.no_grad():
                    t_pred = t_model(imgs)
                    if opt["d_feature"]:
                        s_f = [S_Converter[k](activation[f"s_f{k + 1}"]) for k in range(3)]  # BUG
                        t_f = [T_Converter[k](activation[f"t_f{k + 1}"]) for k in range(3)]
            loss = compute_loss(pred, targets)
            if opt["dist"]:
                loss = compute_distillation_output_loss(pred, t_pred, loss, hyp)
                if opt["d_feature"]:
                    loss = compute_distillation_feature_loss(s_f, t_f, loss, hyp)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        print("epoch", epoch, "loss", round(loss.item(), 4))


train({"lr0": 0.01, "momentum": 0.937, "dist": 1.0}, {"dist": True, "d_feature": True})
