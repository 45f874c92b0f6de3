# Source: https://github.com/ThilinaRajapakse/simpletransformers/issues/739
# Original: ThilinaRajapakse/simpletransformers simpletransformers/classification/classification_model.py
# (ClassificationModel.train: model.train() once before the epoch loop; evaluate_during_training_steps calls
# eval_model -> evaluate, which sets model.eval() and never switches back)
# Bug: with evaluate_during_training the step loop evaluates every few steps; evaluate() leaves the model in eval
# mode and train() never calls model.train() again, so the rest of the run trains with dropout off.
import torch
import torch.nn.functional as F

torch.manual_seed(0)


class TinyBert(torch.nn.Module):
    def __init__(self, vocab=300, dim=48, labels=3):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, dim)
        self.layer = torch.nn.TransformerEncoderLayer(dim, 4, 96, dropout=0.1, batch_first=True)
        self.dropout = torch.nn.Dropout(0.1)
        self.classifier = torch.nn.Linear(dim, labels)

    def forward(self, input_ids, labels=None):
        logits = self.classifier(self.dropout(self.layer(self.emb(input_ids)).mean(1)))
        loss = F.cross_entropy(logits, labels) if labels is not None else None
        return loss, logits


class ClassificationModel:
    def __init__(self, args):
        self.args = args
        self.model = TinyBert()

    def train_model(self, train_df, eval_df):
        train_dataset = torch.utils.data.TensorDataset(*train_df)
        loader = torch.utils.data.DataLoader(train_dataset, batch_size=self.args["train_batch_size"], shuffle=True)
        return self.train(loader, eval_df)

    def train(self, train_dataloader, eval_df):
        model = self.model
        optimizer = torch.optim.AdamW(model.parameters(), lr=self.args["learning_rate"])
        global_step = 0
        model.zero_grad()
        model.train()
        for _ in range(self.args["num_train_epochs"]):
            for input_ids, labels in train_dataloader:
                loss, _ = model(input_ids, labels=labels)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), self.args["max_grad_norm"])
                optimizer.step()
                model.zero_grad()
                global_step += 1
                if self.args["evaluate_during_training"] and global_step % self.args["evaluate_during_training_steps"] == 0:
                    results = self.eval_model(eval_df)  # BUG
                    print("step", global_step, "eval", results)
        return global_step

    def eval_model(self, eval_df):
        return self.evaluate(eval_df)

    def evaluate(self, eval_df):
        model = self.model
        eval_loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*eval_df), batch_size=32)
        model.eval()
        eval_loss, correct, n = 0.0, 0, 0
        for input_ids, labels in eval_loader:
            with torch.no_grad():
                loss, logits = model(input_ids, labels=labels)
            eval_loss += loss.item()
            correct += (logits.argmax(-1) == labels).sum().item()
            n += len(labels)
        return {"eval_loss": round(eval_loss / len(eval_loader), 4), "acc": round(correct / n, 3)}


def make(n):
    ids = torch.randint(0, 300, (n, 16))
    return ids, (ids[:, :4].sum(1) % 3)


args = {"train_batch_size": 16, "learning_rate": 1e-3, "num_train_epochs": 2, "max_grad_norm": 1.0,
        "evaluate_during_training": True, "evaluate_during_training_steps": 10}
ClassificationModel(args).train_model(make(480), make(96))
