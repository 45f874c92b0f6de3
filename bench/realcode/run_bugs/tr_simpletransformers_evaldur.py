# Source: https://github.com/ThilinaRajapakse/simpletransformers/issues/941
# Original: ThilinaRajapakse/simpletransformers simpletransformers/language_modeling/language_modeling_model.py
# (LanguageModelingModel.train / eval_model / evaluate)
# Bug: with evaluate_during_training the batch loop calls eval_model() every evaluate_during_training_steps;
# evaluate() sets model.eval() and nothing sets train mode again until the next epoch, so dropout is off for
# the rest of the epoch.
import torch
import torch.nn.functional as F

torch.manual_seed(0)


class LanguageModelingModel:
    def __init__(self):
        self.model = torch.nn.Sequential(torch.nn.Embedding(64, 32), torch.nn.Dropout(0.1), torch.nn.Linear(32, 64),
                                         torch.nn.Dropout(0.1), torch.nn.Linear(64, 64))
        self.args = {"num_train_epochs": 3, "evaluate_during_training": True, "evaluate_during_training_steps": 8}

    def train(self, train_data, eval_data):
        model = self.model
        optimizer = torch.optim.AdamW(model.parameters(), lr=4e-5)
        global_step = 0
        for epoch in range(self.args["num_train_epochs"]):
            model.train()
            for inputs, labels in train_data:
                logits = model(inputs)
                loss = F.cross_entropy(logits.reshape(-1, 64), labels.reshape(-1))
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                model.zero_grad()
                global_step += 1
                if self.args["evaluate_during_training"] and global_step % self.args["evaluate_during_training_steps"] == 0:
                    results = self.eval_model(eval_data)  # BUG
                    print("step", global_step, "eval loss", round(results["eval_loss"], 3))
        return global_step

    def eval_model(self, eval_data):
        return self.evaluate(eval_data)

    def evaluate(self, eval_data):
        model = self.model
        model.eval()
        eval_loss = 0.0
        for inputs, labels in eval_data:
            with torch.no_grad():
                eval_loss += F.cross_entropy(model(inputs).reshape(-1, 64), labels.reshape(-1)).item()
        return {"eval_loss": eval_loss / len(eval_data)}


train_data = [(torch.randint(0, 64, (8, 16)), torch.randint(0, 64, (8, 16))) for _ in range(20)]
eval_data = [(torch.randint(0, 64, (8, 16)), torch.randint(0, 64, (8, 16))) for _ in range(3)]
LanguageModelingModel().train(train_data, eval_data)
print("done")
