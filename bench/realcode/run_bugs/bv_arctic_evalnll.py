# Source: https://github.com/Snowflake-AI-Research/Arctic-Platform/pull/88 (review comment on eval_nll; the
# evaluation was added in https://github.com/Snowflake-AI-Research/Arctic-Platform/pull/82)
# Original: Snowflake-AI-Research/Arctic-Platform cortex_training/recipes/sft/conversational/train.py (eval_nll,
# the SFT loop) and the training worker (forward_backward, optim_step); from the PR text
# Bug: the SFT recipe's eval_nll() measures the test NLL with the client's forward_loss, an alias of
# forward_backward: every evaluation batch runs a full backward. The worker zeroes gradients only inside its
# optimizer step, so the evaluation batches' gradients are added to the next training update.
import torch
import torch.nn.functional as F

torch.manual_seed(0)


class TrainingWorker:
    """The server side: owns the model and the optimizer; zeroes gradients only after its own step."""

    def __init__(self, model, lr):
        self.model = model
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=lr)

    def forward_backward(self, batch):
        logits = self.model(batch["input_ids"][:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), batch["input_ids"][:, 1:].reshape(-1))
        loss.backward()
        return {"loss": loss.item(), "tokens": batch["input_ids"][:, 1:].numel()}

    def forward(self, batch):
        with torch.no_grad():
            logits = self.model(batch["input_ids"][:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), batch["input_ids"][:, 1:].reshape(-1))
        return {"loss": loss.item(), "tokens": batch["input_ids"][:, 1:].numel()}

    def optim_step(self):
        self.optimizer.step()
        self.optimizer.zero_grad()


class TrainingClient:
    def __init__(self, worker):
        self.worker = worker

    def forward_backward(self, batch):
        return self.worker.forward_backward(batch)

    forward_loss = forward_backward

    def forward(self, batch):
        return self.worker.forward(batch)

    def optim_step(self):
        self.worker.optim_step()


def eval_nll(client, eval_batches):
    total, tokens = 0.0, 0
    for batch in eval_batches:
        out = client.forward_loss(batch)  # BUG
        total += out["loss"] * out["tokens"]
        tokens += out["tokens"]
    return total / tokens


def forward_backward_step(client, batch):
    out = client.forward_backward(batch)
    client.optim_step()
    return out["loss"]


def conversations(n, vocab=40, seq=24):
    return [{"input_ids": torch.randint(0, vocab, (4, seq))} for _ in range(n)]


model = torch.nn.Sequential(torch.nn.Embedding(40, 64), torch.nn.Linear(64, 128), torch.nn.GELU(),
                            torch.nn.Linear(128, 40))
client = TrainingClient(TrainingWorker(model, lr=3e-4))
train_batches, test_batches = conversations(90), conversations(4)
eval_every = 10
for step, batch in enumerate(train_batches):
    if step % eval_every == 0:
        print("step", step, "test/nll", round(eval_nll(client, test_batches), 4))
    loss = forward_backward_step(client, batch)
print("final test/nll", round(eval_nll(client, test_batches), 4))
