# Source: https://github.com/wonbeomjang/mobile-hair-segmentation-pytorch/issues/3
# Original: wonbeomjang/mobile-hair-segmentation-pytorch loss/loss.py (ImageGradientLoss.forward) and src/train.py
# Bug: the image-gradient loss turns the network's prediction into a hard mask with argmax before the Sobel
# filters, so the term has no gradient: the weighted total is the BCE loss plus a constant, and the gradient
# consistency term never trains the network (the maintainer: "I will do an experiment").
import torch
import torch.nn.functional as F

torch.manual_seed(0)


class ImageGradientLoss(torch.nn.modules.loss._WeightedLoss):
    def forward(self, pred, gray_image):
        size = pred.size()
        pred = pred.argmax(1).view(size[0], 1, size[2], size[3]).float()  # BUG
        kx = torch.tensor([[1.0, 0.0, -1.0], [2.0, 0.0, -2.0], [1.0, 0.0, -1.0]]).view(1, 1, 3, 3)
        ky = torch.tensor([[1.0, 2.0, 1.0], [0.0, 0.0, 0.0], [-1.0, -2.0, -1.0]]).view(1, 1, 3, 3)
        I_x, G_x = F.conv2d(gray_image, kx), F.conv2d(pred, kx)
        I_y, G_y = F.conv2d(gray_image, ky), F.conv2d(pred, ky)
        G = torch.sqrt(torch.pow(G_x, 2) + torch.pow(G_y, 2))
        gradient = 1 - torch.pow(I_x * G_x + I_y * G_y, 2)
        image_gradient_loss = torch.sum(torch.mul(G, gradient)) / torch.sum(G)
        return image_gradient_loss if image_gradient_loss > 0 else 0


class MobileHairNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
                                        torch.nn.Conv2d(16, 16, 3, padding=1), torch.nn.ReLU())
        self.out = torch.nn.Conv2d(16, 2, 1)

    def forward(self, x):
        return self.out(self.body(x))


class Trainer:
    def __init__(self, gradient_loss_weight=0.5):
        self.net = MobileHairNet()
        self.optimizer = torch.optim.Adadelta(self.net.parameters(), lr=1.0)
        self.gradient_loss_weight = gradient_loss_weight

    def train(self, data_loader, num_epoch):
        image_gradient_criterion = ImageGradientLoss()
        bce_criterion = torch.nn.CrossEntropyLoss()
        for epoch in range(num_epoch):
            for step, (image, gray_image, mask) in enumerate(data_loader):
                pred = self.net(image)
                pred_flat = pred.permute(0, 2, 3, 1).reshape(-1, 2)
                mask_flat = mask.reshape(-1)
                image_gradient_loss = image_gradient_criterion(pred, gray_image)
                bce_loss = bce_criterion(pred_flat, mask_flat)
                loss = bce_loss + self.gradient_loss_weight * image_gradient_loss
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()
            print("epoch", epoch, f"bce {bce_loss.item():.4f}", f"grad {float(image_gradient_loss):.4f}")


g = torch.Generator().manual_seed(1)
data = []
for _ in range(12):
    image = torch.rand(4, 3, 24, 24, generator=g)
    data.append((image, image.mean(1, keepdim=True) * 0.1, (image[:, 0] > 0.5).long()))
Trainer().train(data, num_epoch=3)
