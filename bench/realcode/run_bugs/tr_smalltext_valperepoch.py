# Source: https://github.com/webis-de/small-text/issues/40
# Original: webis-de/small-text small_text/integrations/transformers/classifiers/classification.py
# (TransformerBasedClassification._train_loop_process_batches and its validation call)
# Bug: with validations_per_epoch > 1 the batch loop validates in the middle of the epoch; the validation puts the
# model in eval mode and the loop never switches it back, so the rest of each epoch trains with dropout off.
import torch
import torch.nn.functional as F

torch.manual_seed(0)


class TextClassifier(torch.nn.Module):
    def __init__(self, vocab=100, dim=32, classes=3):
        super().__init__()
        self.emb = torch.nn.EmbeddingBag(vocab, dim)
        self.dropout = torch.nn.Dropout(0.3)
        self.out = torch.nn.Linear(dim, classes)

    def forward(self, text):
        return self.out(self.dropout(self.emb(text)))


class TransformerBasedClassification:
    def __init__(self, num_epochs=4, validations_per_epoch=2):
        self.num_epochs, self.validations_per_epoch = num_epochs, validations_per_epoch
        self.model = TextClassifier()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=2e-3)

    def fit(self, train_batches, valid_batches):
        for epoch in range(self.num_epochs):
            self._train_loop_epoch(train_batches, valid_batches)

    def _train_loop_epoch(self, train_batches, valid_batches):
        self.model.train()
        self._train_loop_process_batches(train_batches, valid_batches)

    def _train_loop_process_batches(self, train_batches, valid_batches):
        validate_every = len(train_batches) // self.validations_per_epoch
        for i, (text, cls) in enumerate(train_batches):
            self.optimizer.zero_grad()
            loss = F.cross_entropy(self.model(text), cls)
            loss.backward()
            self.optimizer.step()
            if (i + 1) % validate_every == 0:
                valid_loss, valid_acc = self.validate(valid_batches)  # BUG

    def validate(self, valid_batches):
        self.model.eval()
        total, correct = 0.0, 0
        with torch.no_grad():
            for text, cls in valid_batches:
                logits = self.model(text)
                total += F.cross_entropy(logits, cls).item()
                correct += (logits.argmax(1) == cls).sum().item()
        return total / len(valid_batches), correct


g = torch.Generator().manual_seed(1)
train = [(torch.randint(0, 100, (16, 12), generator=g), torch.randint(0, 3, (16,), generator=g)) for _ in range(20)]
valid = [(torch.randint(0, 100, (16, 12), generator=g), torch.randint(0, 3, (16,), generator=g)) for _ in range(3)]
clf = TransformerBasedClassification()
clf.fit(train, valid)
print("done; model in training mode:", clf.model.training)
