"""facenet_pytorch train_triplet.py: the triplet loss is built on features copied through NumPy, so it trains nothing.

Source: https://github.com/liorshk/facenet_pytorch/issues/6 ("Bug: triplet loss ... it should be out_a[hard_triplets].
Otherwise, grad won't be caculated."), closed.
Read: train_triplet.py at 8153c2ced0c785c1bae4891d69cf0534b3b19f67 (train, TripletMarginLoss, adjust_learning_rate,
create_optimizer) and utils.PairwiseDistance.
Theirs: the train loop (three forwards, hard-triplet selection by d_n - d_p < margin through NumPy, the selected
embeddings and images rebuilt with torch.from_numpy(...), the triplet loss on the rebuilt embeddings, the classifier
cross-entropy on the selected images, loss = cross_entropy_loss + triplet_loss, zero_grad/backward/step,
adjust_learning_rate), Adagrad with lr_decay, PairwiseDistance.
Ours: a tiny conv FaceModel instead of the ResNet one, random triplets instead of MS-Celeb, CPU (no .cuda()), the
legacy autograd.Function subclasses written as plain classes (the same forward arithmetic), no logger/ROC/test loop.
"""
import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim


class PairwiseDistance:
    def __init__(self, p):
        self.norm = p

    def forward(self, x1, x2):
        eps = 1e-4 / x1.size(1)
        diff = torch.abs(x1 - x2)
        out = torch.pow(diff, self.norm).sum(dim=1)
        return torch.pow(out + eps, 1.0 / self.norm)


class TripletMarginLoss:
    def __init__(self, margin):
        self.margin = margin
        self.pdist = PairwiseDistance(2)  # norm 2

    def forward(self, anchor, positive, negative):
        d_p = self.pdist.forward(anchor, positive)
        d_n = self.pdist.forward(anchor, negative)
        dist_hinge = torch.clamp(self.margin + d_p - d_n, min=0.0)
        return torch.mean(dist_hinge)


class FaceModel(nn.Module):
    def __init__(self, embedding_size, num_classes):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten())
        self.fc = nn.Linear(8 * 16, embedding_size)
        self.classifier = nn.Linear(embedding_size, num_classes)

    def l2_norm(self, x):
        return x / x.norm(dim=1, keepdim=True).clamp_min(1e-10)

    def forward(self, x):
        self.features_out = self.l2_norm(self.fc(self.features(x)))
        return self.features_out * 10

    def forward_classifier(self, x):
        return self.classifier(self.forward(x))


class Args:
    margin = 0.5
    lr = 0.1
    lr_decay = 1e-4
    wd = 0.0


args = Args()
l2_dist = PairwiseDistance(2)


def adjust_learning_rate(optimizer):
    for group in optimizer.param_groups:
        if "step" not in group:
            group["step"] = 0
        group["step"] += 1
        group["lr"] = args.lr / (1 + group["step"] * args.lr_decay)


def train(train_loader, model, optimizer, epoch):
    model.train()
    for batch_idx, (data_a, data_p, data_n, label_p, label_n) in enumerate(train_loader):
        # compute output
        out_a, out_p, out_n = model(data_a), model(data_p), model(data_n)
        # Choose the hard negatives
        d_p = l2_dist.forward(out_a, out_p)
        d_n = l2_dist.forward(out_a, out_n)
        all = (d_n - d_p < args.margin).cpu().data.numpy().flatten()
        hard_triplets = np.where(all == 1)
        if len(hard_triplets[0]) == 0:
            continue
        out_selected_a = torch.from_numpy(out_a.cpu().data.numpy()[hard_triplets])  # BUG
        out_selected_p = torch.from_numpy(out_p.cpu().data.numpy()[hard_triplets])
        out_selected_n = torch.from_numpy(out_n.cpu().data.numpy()[hard_triplets])

        selected_data_a = torch.from_numpy(data_a.cpu().data.numpy()[hard_triplets])
        selected_data_p = torch.from_numpy(data_p.cpu().data.numpy()[hard_triplets])
        selected_data_n = torch.from_numpy(data_n.cpu().data.numpy()[hard_triplets])

        selected_label_p = torch.from_numpy(label_p.cpu().numpy()[hard_triplets])
        selected_label_n = torch.from_numpy(label_n.cpu().numpy()[hard_triplets])
        triplet_loss = TripletMarginLoss(args.margin).forward(out_selected_a, out_selected_p, out_selected_n)

        cls_a = model.forward_classifier(selected_data_a)
        cls_p = model.forward_classifier(selected_data_p)
        cls_n = model.forward_classifier(selected_data_n)

        criterion = nn.CrossEntropyLoss()
        predicted_labels = torch.cat([cls_a, cls_p, cls_n])
        true_labels = torch.cat([selected_label_p, selected_label_p, selected_label_n])
        cross_entropy_loss = criterion(predicted_labels, true_labels)

        loss = cross_entropy_loss + triplet_loss
        # compute gradient and update weights
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

        # update the optimizer learning rate
        adjust_learning_rate(optimizer)


torch.manual_seed(0)
num_classes = 10


def make_batch():
    label_p = torch.randint(0, num_classes, (16,))
    label_n = (label_p + torch.randint(1, num_classes, (16,))) % num_classes
    return torch.randn(16, 3, 24, 24), torch.randn(16, 3, 24, 24), torch.randn(16, 3, 24, 24), label_p, label_n


train_loader = [make_batch() for _ in range(10)]
model = FaceModel(embedding_size=32, num_classes=num_classes)
optimizer = optim.Adagrad(model.parameters(), lr=args.lr, lr_decay=args.lr_decay, weight_decay=args.wd)
for epoch in range(2):
    train(train_loader, model, optimizer, epoch)
