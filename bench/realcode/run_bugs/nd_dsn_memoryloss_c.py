"""DSN sketch/photo retrieval: the memory loss is computed on detached features, so its term trains nothing.

Source: https://github.com/haowang1992/DSN/issues/1 (comments of 2022-07-17: ".detach() causes loss_memory.grad to be
none. It's not being used?"; open, no maintainer answer)
Read: src/train_cse_resnet_sketchy_ext.py (train) and src/tool.py (MemoryStore, SupConLoss, AverageMeter) at
74b9dea7da58c8219df90d8e208a74a520230a1e.
Theirs: the train() step (shuffled sketch and photo batches with two augmented views each, one forward over the six
stacks, memory.add_entries of the detached sketch features, loss_memory = 1 - memory.memory_loss(detached photo
features), cross-entropy + SupConLoss on the normalised hash codes + memory_lambda * loss_memory, zero_grad /
backward / step), MemoryStore with add_entries / get_class_center / memory_loss / flush, SupConLoss.
Ours: a tiny two-branch MLP instead of the CSE-ResNet50 student, no teacher and no KD term, random tensors for the
Sketchy images, CPU instead of .cuda(), a MemoryStore that takes its device as an argument, fewer classes and steps.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class SupConLoss(nn.Module):
    def __init__(self, temperature=0.07, base_temperature=0.07):
        super().__init__()
        self.temperature = temperature
        self.base_temperature = base_temperature

    def forward(self, features, labels):
        batch_size = features.shape[0]
        labels = labels.contiguous().view(-1, 1)
        mask = torch.eq(labels, labels.T).float()
        contrast_count = features.shape[1]
        contrast_feature = torch.cat(torch.unbind(features, dim=1), dim=0)
        anchor_feature = contrast_feature
        anchor_count = contrast_count
        anchor_dot_contrast = torch.div(torch.matmul(anchor_feature, contrast_feature.T), self.temperature)
        logits_max, _ = torch.max(anchor_dot_contrast, dim=1, keepdim=True)
        logits = anchor_dot_contrast - logits_max.detach()
        mask = mask.repeat(anchor_count, contrast_count)
        logits_mask = torch.scatter(torch.ones_like(mask), 1, torch.arange(batch_size * anchor_count).view(-1, 1), 0)
        mask = mask * logits_mask
        exp_logits = torch.exp(logits) * logits_mask
        log_prob = logits - torch.log(exp_logits.sum(1, keepdim=True))
        mean_log_prob_pos = (mask * log_prob).sum(1) / mask.sum(1)
        loss = -(self.temperature / self.base_temperature) * mean_log_prob_pos
        return loss.view(anchor_count, batch_size).mean()


class MemoryStore:
    def __init__(self, n_classes, topk, embed_dim, device="cpu"):
        self.n_classes = n_classes
        self.topk = topk
        self.embed_dim = embed_dim
        self.device = torch.device(device)
        self.flush()

    def get_class_center(self, label):
        if self.memory_full_flag[label] == 0:
            return None
        return torch.mean(self.memory_embeds[label][:self.memory_full_flag[label], :], 0)

    def add_entries(self, embeds, labels, queries, query_labels):
        for idx, embed in enumerate(embeds):
            saved_embed_nums = self.memory_full_flag[labels[idx]].type(torch.int32)
            if saved_embed_nums < self.topk:
                self.memory_embeds[labels[idx]][saved_embed_nums] = embed
                self.memory_full_flag[labels[idx]] += 1
            else:
                corresponding_idx = torch.nonzero(query_labels == labels[idx]).view(-1)
                if corresponding_idx.numel() == 0:
                    continue
                query = torch.mean(queries[corresponding_idx], 0)
                score, furthest_idx = self.get_furthest_entry(query, labels[idx])
                if F.cosine_similarity(query.view(1, -1), embed.view(1, -1)) > score:
                    self.memory_embeds[furthest_idx] = embed

    def get_furthest_entry(self, query, label):
        scores = F.cosine_similarity(self.memory_embeds[label], query.view(1, -1))
        score, idx = torch.min(scores, 0)
        return score, idx

    def memory_loss(self, queries, labels):
        loss = []
        for idx, query in enumerate(queries):
            center = self.get_class_center(labels[idx])
            if center is not None:
                loss.append(F.cosine_similarity(query.view(1, -1), center.view(1, -1)))
        if len(loss) == 0:
            return torch.Tensor([1.0])  # to make the loss invalid
        return sum(loss) / len(loss)

    def flush(self):
        self.memory_embeds = torch.zeros((self.n_classes, self.topk, self.embed_dim), device=self.device)
        self.memory_full_flag = torch.zeros(self.n_classes, device=self.device).type(torch.int8)


class CSEModelKDHashing(nn.Module):
    def __init__(self, in_dim=48, feat_dim=64, num_hashing=32, num_classes=10):
        super().__init__()
        self.features = nn.Sequential(nn.Linear(in_dim + 1, feat_dim), nn.ReLU(), nn.Linear(feat_dim, feat_dim))
        self.hashing = nn.Linear(feat_dim, num_hashing)
        self.classifier = nn.Linear(num_hashing, num_classes)
        self.classifier_kd = nn.Linear(num_hashing, num_classes)

    def forward(self, x, tag):
        features = self.features(torch.cat([x, tag], 1))
        hash_code = self.hashing(features)
        return self.classifier(hash_code), self.classifier_kd(hash_code), hash_code, features


def train(batches, model, criterion, criterion_contrastive, optimizer, memory, args):
    model.train()
    memory.flush()
    for (sketch, sketch1, sketch2, label_s), (image, image1, image2, label_i) in batches:
        tag_zeros = torch.zeros(sketch.size()[0], 1)
        tag_ones = torch.ones(image.size()[0], 1)
        tag_all = torch.cat([tag_zeros, tag_ones], dim=0)

        sketch_shuffle_idx = torch.randperm(sketch.size(0))
        image_shuffle_idx = torch.randperm(image.size(0))
        sketch, sketch1, sketch2 = sketch[sketch_shuffle_idx], sketch1[sketch_shuffle_idx], sketch2[sketch_shuffle_idx]
        label_s = label_s[sketch_shuffle_idx].view(-1, )
        image, image1, image2 = image[image_shuffle_idx], image1[image_shuffle_idx], image2[image_shuffle_idx]
        label_i = label_i[image_shuffle_idx].view(-1, )
        target_all = torch.cat([label_s, label_i])

        output, output_kd, hash_code, features = model(torch.cat([sketch, image, sketch1, image1, sketch2, image2], 0),
                                                       torch.cat([tag_all, tag_all, tag_all], 0))
        output = output[:tag_all.size(0)]

        memory.add_entries(features[:tag_zeros.size(0)].detach(), label_s.detach(),
                           features[tag_zeros.size(0):tag_all.size(0)].detach(), label_i.detach())
        loss_memory = 1 - memory.memory_loss(features[tag_zeros.size(0):tag_all.size(0)].detach(), label_i.detach())  # BUG

        contrastive_feature = F.normalize(hash_code[tag_all.size(0):])
        contrastive_feature1 = torch.unsqueeze(contrastive_feature[:tag_all.size(0)], 1)
        contrastive_feature2 = torch.unsqueeze(contrastive_feature[tag_all.size(0):], 1)

        loss = criterion(output, target_all)
        loss_contrastive = criterion_contrastive(torch.cat([contrastive_feature1, contrastive_feature2], 1), target_all)

        # compute gradient and do SGD step
        optimizer.zero_grad()
        loss_total = args["cls_lambda"] * loss + args["contrastive_lambda"] * loss_contrastive + \
            args["memory_lambda"] * loss_memory
        loss_total.backward()
        optimizer.step()


torch.manual_seed(1)
num_classes = 10
args = {"cls_lambda": 1.0, "contrastive_lambda": 0.1, "memory_lambda": 1.0, "topk": 5}


def views(n):
    base = torch.randn(n, 48)
    return base, base + 0.1 * torch.randn(n, 48), base + 0.1 * torch.randn(n, 48), torch.randint(0, num_classes, (n,))


batches = [(views(8), views(16)) for _ in range(30)]
model = CSEModelKDHashing(num_classes=num_classes)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, weight_decay=5e-4)
memory = MemoryStore(num_classes, args["topk"], 64)
for epoch in range(3):
    train(batches, model, nn.CrossEntropyLoss(), SupConLoss(0.07), optimizer, memory, args)
