# Source: https://github.com/huggingface/transformers/pull/6999 (fixes #6939)
# Original: huggingface/transformers src/transformers/trainer.py (Trainer.train / Trainer.training_step), v3.1
# Bug: train() adds the tensor training_step returns into tr_loss; the loss was not detached, so the running
# sum chains every step's graph into one that lives for the whole run and RAM grows until it is exhausted.
import torch
import torch.nn.functional as F

torch.manual_seed(0)


class Trainer:
    def __init__(self, model, optimizer, batches, epochs):
        self.model, self.optimizer, self.batches, self.epochs = model, optimizer, batches, epochs
        self.global_step = 0

    def training_step(self, inputs, labels):
        self.model.train()
        logits = self.model(inputs)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), labels.view(-1))
        loss.backward()
        return loss

    def train(self):
        tr_loss = torch.tensor(0.0)
        logging_loss = 0.0
        for epoch in range(self.epochs):
            for inputs, labels in self.batches:
                tr_loss += self.training_step(inputs, labels)  # BUG
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
                self.optimizer.step()
                self.model.zero_grad()
                self.global_step += 1
                if self.global_step % 20 == 0:
                    print("step", self.global_step, "loss", round((tr_loss.item() - logging_loss) / 20, 4))
                    logging_loss = tr_loss.item()
        return tr_loss.item() / self.global_step


model = torch.nn.Sequential(torch.nn.Embedding(100, 32), torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 100))
batches = [(torch.randint(0, 100, (8, 16)), torch.randint(0, 100, (8, 16))) for _ in range(40)]
trainer = Trainer(model, torch.optim.AdamW(model.parameters(), lr=5e-4), batches, epochs=2)
print("average loss", round(trainer.train(), 4))
