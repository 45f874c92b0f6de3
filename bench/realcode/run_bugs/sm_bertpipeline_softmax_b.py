"""Sentiment classifier fine-tuning loop that feeds softmax probabilities to nn.CrossEntropyLoss.

Source: https://github.com/sugi-chan/custom_bert_pipeline/issues/1 ("Softmax before nn.CrossEntropyLoss()")
Original: sugi-chan/custom_bert_pipeline bert_pipeline.ipynb, cells 19-24 (text_dataset, dataloaders_dict,
train_model, the two-group Adam and StepLR), read at 70896ae.
Bug: train_model applies F.softmax to the classifier logits and passes the probabilities to
nn.CrossEntropyLoss, which applies log_softmax again; the loss cannot fall below log(1 + e^-1) = 0.313
for two classes and its gradients shrink (the notebook's own log plateaus at 0.363). The issue is open,
unanswered; the softmax-then-CrossEntropyLoss pair is a fact of the cell.
Ours: a small embedding-bag classifier instead of the pretrained BERT (same dropout + linear head and
`.bert`/`.classifier` parameter groups), random token ids whose label is the presence of one token instead
of IMDB reviews, CPU, 4 epochs; the scheduler.step() at the top of the training phase is theirs.
"""
import copy
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.optim import lr_scheduler
from torch.utils.data import Dataset

torch.manual_seed(0)
np.random.seed(0)
max_seq_length = 32
vocab = 200


class TinyEncoder(nn.Module):
    def __init__(self, hidden_size=64):
        super().__init__()
        self.embeddings = nn.Embedding(vocab, hidden_size, padding_idx=0)
        self.pooler = nn.Linear(hidden_size, hidden_size)

    def forward(self, input_ids):
        return torch.tanh(self.pooler(self.embeddings(input_ids).mean(1)))


class BertForSequenceClassification(nn.Module):
    def __init__(self, num_labels=2):
        super().__init__()
        self.num_labels = num_labels
        self.bert = TinyEncoder()
        self.dropout = nn.Dropout(0.1)
        self.classifier = nn.Linear(64, num_labels)
        nn.init.xavier_normal_(self.classifier.weight)

    def forward(self, input_ids):
        pooled_output = self.bert(input_ids)
        pooled_output = self.dropout(pooled_output)
        logits = self.classifier(pooled_output)
        return logits


class text_dataset(Dataset):
    def __init__(self, x_y_list, transform=None):
        self.x_y_list = x_y_list
        self.transform = transform

    def __getitem__(self, index):
        ids_review = torch.tensor(self.x_y_list[0][index])
        sentiment = self.x_y_list[1][index]
        list_of_labels = [torch.from_numpy(np.array(sentiment))]
        return ids_review, list_of_labels[0]

    def __len__(self):
        return len(self.x_y_list[0])


def make_split(n):
    ids = np.random.randint(1, vocab, size=(n, max_seq_length))
    positive = np.random.rand(n) < 0.5
    ids[positive, 0] = 7  # the token that decides the label
    ids[~positive] = np.where(ids[~positive] == 7, 8, ids[~positive])
    y = [[0, 1] if p else [1, 0] for p in positive]
    return ids.tolist(), y


X_train, y_train = make_split(512)
X_test, y_test = make_split(128)
batch_size = 16
train_lists = [X_train, y_train]
test_lists = [X_test, y_test]
training_dataset = text_dataset(x_y_list=train_lists)
test_dataset = text_dataset(x_y_list=test_lists)
dataloaders_dict = {"train": torch.utils.data.DataLoader(training_dataset, batch_size=batch_size, shuffle=True, num_workers=0),
                    "val": torch.utils.data.DataLoader(test_dataset, batch_size=batch_size, shuffle=True, num_workers=0)}
dataset_sizes = {"train": len(train_lists[0]), "val": len(test_lists[0])}
device = torch.device("cpu")


def train_model(model, criterion, optimizer, scheduler, num_epochs=25):
    since = time.time()
    print("starting")
    best_model_wts = copy.deepcopy(model.state_dict())
    best_loss = 100

    for epoch in range(num_epochs):
        print(f"Epoch {epoch}/{num_epochs - 1}")
        print("-" * 10)

        for phase in ["train", "val"]:
            if phase == "train":
                scheduler.step()
                model.train()
            else:
                model.eval()

            running_loss = 0.0
            sentiment_corrects = 0

            for inputs, sentiment in dataloaders_dict[phase]:
                inputs = inputs.to(device)
                sentiment = sentiment.to(device)
                optimizer.zero_grad()

                with torch.set_grad_enabled(phase == "train"):
                    outputs = model(inputs)

                    outputs = F.softmax(outputs, dim=1)  # BUG

                    loss = criterion(outputs, torch.max(sentiment.float(), 1)[1])
                    if phase == "train":
                        loss.backward()
                        optimizer.step()

                running_loss += loss.item() * inputs.size(0)
                sentiment_corrects += torch.sum(torch.max(outputs, 1)[1] == torch.max(sentiment, 1)[1])

            epoch_loss = running_loss / dataset_sizes[phase]
            sentiment_acc = sentiment_corrects.double() / dataset_sizes[phase]
            print(f"{phase} total loss: {epoch_loss:.4f} ")
            print(f"{phase} sentiment_acc: {sentiment_acc:.4f}")

            if phase == "val" and epoch_loss < best_loss:
                best_loss = epoch_loss
                best_model_wts = copy.deepcopy(model.state_dict())

    time_elapsed = time.time() - since
    print(f"Training complete in {time_elapsed // 60:.0f}m {time_elapsed % 60:.0f}s")
    model.load_state_dict(best_model_wts)
    return model


model = BertForSequenceClassification(2)
model.to(device)
lrlast = .01
lrmain = .001
optim1 = optim.Adam([
    {"params": model.bert.parameters(), "lr": lrmain},
    {"params": model.classifier.parameters(), "lr": lrlast},
])
optimizer_ft = optim1
criterion = nn.CrossEntropyLoss()
exp_lr_scheduler = lr_scheduler.StepLR(optimizer_ft, step_size=3, gamma=0.1)
model_ft1 = train_model(model, criterion, optimizer_ft, exp_lr_scheduler, num_epochs=4)
