"""Our own minimal Hugging Face Trainer script (no hub access): a tiny GPT-2 built from a config.

Written for this bench because the transformers examples load models and data from the hub and the
transformers repository is too large to mirror here. It is the usual Trainer recipe: a causal LM
from `GPT2Config`, a tokenised text dataset, `TrainingArguments` from the command line.

    python hf_trainer_driver.py --output_dir out --max_steps 20 --per_device_train_batch_size 8 ...
"""
import torch
from transformers import GPT2Config, GPT2LMHeadModel, HfArgumentParser, Trainer, TrainingArguments, set_seed


class TokenBlocks(torch.utils.data.Dataset):
    """Fixed-length blocks of token ids from a text file, labels = inputs (the model shifts them)."""

    def __init__(self, path: str, vocab: dict, block: int):
        ids = [vocab[c] for c in open(path, encoding="utf8").read()]
        self.blocks = [ids[i:i + block] for i in range(0, len(ids) - block, block)]

    def __len__(self):
        return len(self.blocks)

    def __getitem__(self, i):
        x = torch.tensor(self.blocks[i])
        return {"input_ids": x, "labels": x.clone()}


def main():
    (args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()
    set_seed(args.seed)
    text = open("train.txt", encoding="utf8").read()
    vocab = {c: i for i, c in enumerate(sorted(set(text)))}
    train = TokenBlocks("train.txt", vocab, 32)
    valid = TokenBlocks("valid.txt", vocab, 32)
    config = GPT2Config(vocab_size=len(vocab), n_positions=32, n_embd=32, n_layer=2, n_head=2)
    model = GPT2LMHeadModel(config)
    trainer = Trainer(model=model, args=args, train_dataset=train, eval_dataset=valid)
    result = trainer.train()
    print(f"train loss {result.training_loss:.4f}")
    metrics = trainer.evaluate()
    print(f"eval loss {metrics['eval_loss']:.4f}")


if __name__ == "__main__":
    main()
