# Source: https://github.com/ServiceNow/LCFCN/issues/20
# Original: ServiceNow/LCFCN losses.py (lc_loss) and the blob helper it calls (get_blob_dict)
# Bug: the loss function calls a helper that switches the model to eval mode to read the predicted blobs and never
# switches it back, so the loss, the backward and every later training step run with BatchNorm in eval mode (the
# maintainer: "not intentional").
import torch
import torch.nn.functional as F

torch.manual_seed(0)


class FCN(torch.nn.Module):
    def __init__(self, n_classes=2):
        super().__init__()
        self.features = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16),
                                            torch.nn.ReLU(), torch.nn.Conv2d(16, 16, 3, padding=1),
                                            torch.nn.BatchNorm2d(16), torch.nn.ReLU())
        self.score = torch.nn.Conv2d(16, n_classes, 1)

    def forward(self, x):
        return self.score(self.features(x))

    @torch.no_grad()
    def predict(self, images):
        return self(images).argmax(1)


def get_blob_dict(model, batch):
    model.eval()
    blobs = model.predict(batch["images"])
    n_blobs = int((blobs == 1).sum())
    return {"blobs": blobs, "n_blobs": n_blobs}


def lc_loss(model, batch):
    model.train()
    blob_dict = get_blob_dict(model, batch)  # BUG
    images, points = batch["images"], batch["points"]
    s = F.log_softmax(model(images), 1)
    loss = F.nll_loss(s, points, ignore_index=0, reduction="sum")
    bg = torch.zeros_like(points)
    loss = loss + 0.1 * F.nll_loss(s, bg, reduction="mean") * (blob_dict["n_blobs"] > 0)
    return loss / max(1, int((points > 0).sum()))


model = FCN()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, weight_decay=5e-4)
for epoch in range(3):
    for it in range(15):
        images = torch.randn(2, 3, 24, 24)
        points = torch.zeros(2, 24, 24, dtype=torch.long)
        points[:, torch.randint(0, 24, (3,)), torch.randint(0, 24, (3,))] = 1
        optimizer.zero_grad()
        loss = lc_loss(model, {"images": images, "points": points})
        loss.backward()
        optimizer.step()
    print("epoch", epoch, "loss", round(loss.item(), 4))
