# Source: https://github.com/caikit/caikit-nlp/pull/258 (fix commit c261042)
# Original: caikit/caikit-nlp caikit_nlp/modules/text_generation/peft_prompt_tuning.py (PeftPromptTuning._train),
# read at c261042^
# Bug: the training method logs each step's loss into step_loss_log[step_count] = loss, the loss tensor itself,
# and converts the values to floats only after the epoch: every step's autograd graph stays referenced by the dict
# until the epoch ends. Accelerate's accumulate()/prepare() and the tqdm bar are left out.
from datetime import datetime

import torch
import torch.nn.functional as F

torch.manual_seed(0)


class PromptTunedLM(torch.nn.Module):
    def __init__(self, vocab=64, dim=64, n_virtual=8):
        super().__init__()
        self.prompt = torch.nn.Parameter(torch.randn(n_virtual, dim) * 0.02)
        self.embed = torch.nn.Embedding(vocab, dim)
        self.body = torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim))
        self.head = torch.nn.Linear(dim, vocab)
        for p in [*self.embed.parameters(), *self.body.parameters(), *self.head.parameters()]:
            p.requires_grad_(False)

    def forward(self, input_ids, labels):
        h = self.embed(input_ids)
        # stands in for attention over the virtual tokens: every position reads the prompt's summary
        logits = self.head(self.body(h + self.prompt.mean(0)))
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1))


class PeftPromptTuning:
    @classmethod
    def _train(cls, model, train_dataloader, num_epochs, learning_rate):
        optimizer = torch.optim.AdamW(params=[p for p in model.parameters() if p.requires_grad], lr=learning_rate)
        lr_scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, 1.0, 0.0, len(train_dataloader) * num_epochs)
        training_loss_tracker = []
        step_count = 1
        for epoch in range(num_epochs):
            step_loss_log = {}
            model.train()
            total_loss = 0
            for batch in train_dataloader:
                loss = model(**batch)
                total_loss += loss.detach().float()
                loss.backward()
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
                step_loss_log[step_count] = loss  # BUG
                step_count += 1
            print("epoch", epoch, "loss", round(float(total_loss) / len(train_dataloader), 4))
            for step, loss_val in step_loss_log.items():
                training_loss_tracker.append({"epoch": epoch, "step": step, "value": float(loss_val),
                                              "timestamp": datetime.isoformat(datetime.now())})
        return {"loss": training_loss_tracker}


def batches(n):
    out = []
    for _ in range(n):
        ids = torch.randint(0, 64, (8, 24))
        out.append({"input_ids": ids, "labels": (ids + 1) % 64})
    return out


meta = PeftPromptTuning._train(PromptTunedLM(), batches(100), num_epochs=2, learning_rate=3e-2)
print("steps logged", len(meta["loss"]))
