# Source: https://github.com/huggingface/trl/pull/3248
# Original: huggingface/trl trl/trainer/grpo_trainer.py (GRPOTrainer._compute_loss, mask_truncated_completions)
# Bug: the loss is normalised by completion_mask.sum(); with truncated completions masked out, a batch
# whose completions were all truncated has an all-zero mask, 0 / 0 = nan, and the nan loss reaches the
# weights (the merged fix clamps the denominator to at least 1).
import tempfile

import torch
from torch.utils.data import Dataset
from transformers import Trainer, TrainingArguments

vocab, prompt_len, completion_len, eos = 50, 6, 10, 1


class TinyPolicy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, 32)
        self.rnn = torch.nn.GRU(32, 32, batch_first=True)
        self.head = torch.nn.Linear(32, vocab)

    def forward(self, input_ids):
        return self.head(self.rnn(self.embed(input_ids))[0])


class Rollouts(Dataset):
    # Sampled completions with their advantages; a completion with no EOS was cut at max length.
    def __init__(self, n=160, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(2, vocab, (n, prompt_len + completion_len), generator=g)
        ends = torch.randint(2, 4 * completion_len, (n,), generator=g)  # max length too small: most are cut
        for i, e in enumerate(ends.tolist()):
            if e < completion_len:
                self.ids[i, prompt_len + e] = eos
        self.advantages = torch.randn(n, generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "advantages": self.advantages[i]}


class GRPOTrainer(Trainer):
    mask_truncated_completions = True

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        input_ids = inputs["input_ids"]
        completion_ids = input_ids[:, prompt_len:]
        is_eos = completion_ids == eos
        eos_idx = torch.where(is_eos.any(1), is_eos.int().argmax(1), torch.full_like(is_eos[:, 0], completion_len, dtype=torch.long))
        completion_mask = (torch.arange(completion_len)[None, :] <= eos_idx[:, None]).int()
        if self.mask_truncated_completions:
            completion_mask = completion_mask * is_eos.any(dim=1).unsqueeze(1).int()
        logits = model(input_ids[:, :-1])[:, prompt_len - 1:]
        per_token_logps = torch.gather(logits.log_softmax(-1), 2, completion_ids.unsqueeze(-1)).squeeze(-1)
        coef = torch.exp(per_token_logps - per_token_logps.detach())
        per_token_loss = -coef * inputs["advantages"].unsqueeze(1)
        loss = (per_token_loss * completion_mask).sum() / completion_mask.sum()  # BUG
        return (loss, logits) if return_outputs else loss


if __name__ == "__main__":
    torch.manual_seed(0)
    args = TrainingArguments(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=8, num_train_epochs=2,
                             learning_rate=1e-3, logging_steps=5, save_strategy="no", report_to=[],
                             use_cpu=True, dataloader_num_workers=0, disable_tqdm=True, remove_unused_columns=False)
    trainer = GRPOTrainer(model=TinyPolicy(), args=args, train_dataset=Rollouts())
    trainer.train()
    print("finite weights:", all(torch.isfinite(p).all().item() for p in trainer.model.parameters()))
