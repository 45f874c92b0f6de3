# Source: https://github.com/Ugenteraan/Deep_Hierarchical_Classification/issues/6
# Original: Ugenteraan/Deep_Hierarchical_Classification model/hierarchical_loss.py (HierarchicalLossNetwork) and
# train.py, read at e4f20ae
# Bug: the dependence loss is built from argmax predictions and new FloatTensors, so it reaches no parameter: the
# total loss the script backpropagates carries a term that trains nothing (the maintainer agreed).
import torch
import torch.nn as nn

torch.manual_seed(0)

hierarchy = {"vehicle": ["car", "truck", "bus"], "animal": ["cat", "dog", "horse"], "plant": ["tree", "flower"]}
level_one_labels = list(hierarchy)
level_two_labels = [c for children in hierarchy.values() for c in children]


class HierarchicalLossNetwork:
    def __init__(self, hierarchical_labels, device="cpu", total_level=2, alpha=1, beta=0.8, p_loss=3):
        self.total_level = total_level
        self.alpha = alpha
        self.beta = beta
        self.p_loss = p_loss
        self.device = device
        self.level_one_labels, self.level_two_labels = level_one_labels, level_two_labels
        self.hierarchical_labels = hierarchical_labels
        self.numeric_hierarchy = self.words_to_indices()

    def words_to_indices(self):
        numeric_hierarchy = {}
        for k, v in self.hierarchical_labels.items():
            numeric_hierarchy[self.level_one_labels.index(k)] = [self.level_two_labels.index(i) for i in v]
        return numeric_hierarchy

    def check_hierarchy(self, current_level, previous_level):
        bool_tensor = [current_level[i] not in self.numeric_hierarchy[previous_level[i].item()]
                       for i in range(previous_level.size()[0])]
        return torch.FloatTensor(bool_tensor).to(self.device)

    def calculate_lloss(self, predictions, true_labels):
        lloss = 0
        for level in range(self.total_level):
            lloss += nn.CrossEntropyLoss()(predictions[level], true_labels[level])
        return self.alpha * lloss

    def calculate_dloss(self, predictions, true_labels):
        dloss = 0
        for level in range(1, self.total_level):
            current_lvl_pred = torch.argmax(nn.Softmax(dim=1)(predictions[level]), dim=1)  # BUG
            prev_lvl_pred = torch.argmax(nn.Softmax(dim=1)(predictions[level - 1]), dim=1)
            D_l = self.check_hierarchy(current_lvl_pred, prev_lvl_pred)
            l_prev = torch.where(prev_lvl_pred == true_labels[level - 1], torch.FloatTensor([0]).to(self.device),
                                 torch.FloatTensor([1]).to(self.device))
            l_curr = torch.where(current_lvl_pred == true_labels[level], torch.FloatTensor([0]).to(self.device),
                                 torch.FloatTensor([1]).to(self.device))
            dloss += torch.sum(torch.pow(self.p_loss, D_l * l_prev) * torch.pow(self.p_loss, D_l * l_curr) - 1)
        return self.beta * dloss


class TwoHeadNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(32, 64), nn.ReLU())
        self.superclass_head = nn.Linear(64, len(level_one_labels))
        self.subclass_head = nn.Linear(64, len(level_two_labels))

    def forward(self, x):
        h = self.body(x)
        return self.superclass_head(h), self.subclass_head(h)


def batches(n=30, size=32):
    g = torch.Generator().manual_seed(3)
    centers = torch.randn(len(level_two_labels), 32, generator=g) * 2
    parent = torch.tensor([level_one_labels.index(k) for k, v in hierarchy.items() for _ in v])
    for _ in range(n):
        y2 = torch.randint(0, len(level_two_labels), (size,), generator=g)
        yield {"image": centers[y2] + torch.randn(size, 32, generator=g), "label_1": parent[y2], "label_2": y2}


device = "cpu"
model = TwoHeadNet()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
HLN = HierarchicalLossNetwork(hierarchical_labels=hierarchy, device=device)
for epoch_idx in range(3):
    epoch_loss = []
    model.train()
    for i, sample in enumerate(batches()):
        batch_x, batch_y1, batch_y2 = sample["image"], sample["label_1"], sample["label_2"]
        optimizer.zero_grad()
        superclass_pred, subclass_pred = model(batch_x)
        prediction = [superclass_pred, subclass_pred]
        dloss = HLN.calculate_dloss(prediction, [batch_y1, batch_y2])
        lloss = HLN.calculate_lloss(prediction, [batch_y1, batch_y2])
        total_loss = lloss + dloss
        total_loss.backward()
        optimizer.step()
        epoch_loss.append(total_loss.item())
    print(f"Training Loss at epoch {epoch_idx} : {sum(epoch_loss) / (i + 1)}", "dloss", round(float(dloss), 3),
          "dloss has grad_fn:", dloss.grad_fn is not None)
