"""SentenceTransformer.fit writes step checkpoints that hold the modules' weights only.

Source: https://github.com/huggingface/sentence-transformers/issues/1086 (maintainer: "Currently it is not
implemented"; PR #1098 proposed a _fit_save_checkpoint that adds the optimizer and scheduler)
Read: SentenceTransformer.fit / _save_checkpoint as in the issue's link (fb7b7a3, SentenceTransformer.py L723) and
the same methods in the 2.x releases (the optimizers and schedulers are locals of fit; _save_checkpoint calls
self.save, which writes each module's weights and config).
Theirs: SentenceTransformer as an nn.Sequential of modules, fit(train_objectives, ...) building one AdamW and one
warmup-linear scheduler per objective inside fit, the step loop, checkpoint_path / checkpoint_save_steps /
checkpoint_save_total_limit and _save_checkpoint's rotation of old step folders, CosineSimilarityLoss.
Ours: a tiny embedding + mean-pooling module instead of a HF Transformer module, random token ids and scores, a
temporary checkpoint folder, torch's LambdaLR for the warmup-linear schedule.
"""
import os
import shutil
import tempfile

import torch
import torch.nn as nn


class TokenEmbedding(nn.Module):
    def __init__(self, vocab_size=300, dim=32):
        super().__init__()
        self.emb = nn.EmbeddingBag(vocab_size, dim, mode="mean")
        self.proj = nn.Linear(dim, dim)

    def forward(self, features):
        features["sentence_embedding"] = self.proj(self.emb(features["input_ids"]))
        return features


class CosineSimilarityLoss(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model
        self.loss_fct = nn.MSELoss()

    def forward(self, sentence_features, labels):
        embeddings = [self.model(f)["sentence_embedding"] for f in sentence_features]
        output = torch.cosine_similarity(embeddings[0], embeddings[1])
        return self.loss_fct(output, labels.view(-1))


class SentenceTransformer(nn.Sequential):
    def save(self, path):
        os.makedirs(path, exist_ok=True)
        for idx, module in enumerate(self):
            torch.save(module.state_dict(), os.path.join(path, f"{idx}_{type(module).__name__}.bin"))

    @staticmethod
    def _get_scheduler(optimizer, warmup_steps, t_total):
        def lr_lambda(step):
            if step < warmup_steps:
                return float(step) / float(max(1, warmup_steps))
            return max(0.0, float(t_total - step) / float(max(1, t_total - warmup_steps)))
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)

    def fit(self, train_objectives, epochs=1, warmup_steps=10, optimizer_class=torch.optim.AdamW,
            optimizer_params={"lr": 2e-5}, weight_decay=0.01, max_grad_norm=1, checkpoint_path=None,  # noqa: B006 (theirs)
            checkpoint_save_steps=500, checkpoint_save_total_limit=0):
        dataloaders = [dataloader for dataloader, _ in train_objectives]
        loss_models = [loss for _, loss in train_objectives]
        steps_per_epoch = min(len(dataloader) for dataloader in dataloaders)
        num_train_steps = int(steps_per_epoch * epochs)

        optimizers = []
        schedulers = []
        for loss_model in loss_models:
            param_optimizer = list(loss_model.named_parameters())
            no_decay = ["bias", "LayerNorm.bias", "LayerNorm.weight"]
            optimizer_grouped_parameters = [
                {"params": [p for n, p in param_optimizer if not any(nd in n for nd in no_decay)],
                 "weight_decay": weight_decay},
                {"params": [p for n, p in param_optimizer if any(nd in n for nd in no_decay)], "weight_decay": 0.0},
            ]
            optimizer = optimizer_class(optimizer_grouped_parameters, **optimizer_params)
            scheduler_obj = self._get_scheduler(optimizer, warmup_steps=warmup_steps, t_total=num_train_steps)
            optimizers.append(optimizer)
            schedulers.append(scheduler_obj)

        global_step = 0
        data_iterators = [iter(dataloader) for dataloader in dataloaders]
        num_train_objectives = len(train_objectives)
        for epoch in range(epochs):
            for loss_model in loss_models:
                loss_model.zero_grad()
                loss_model.train()
            for _ in range(steps_per_epoch):
                for train_idx in range(num_train_objectives):
                    loss_model = loss_models[train_idx]
                    optimizer = optimizers[train_idx]
                    scheduler = schedulers[train_idx]
                    data_iterator = data_iterators[train_idx]
                    try:
                        features, labels = next(data_iterator)
                    except StopIteration:
                        data_iterator = iter(dataloaders[train_idx])
                        data_iterators[train_idx] = data_iterator
                        features, labels = next(data_iterator)
                    loss_value = loss_model(features, labels)
                    loss_value.backward()
                    torch.nn.utils.clip_grad_norm_(loss_model.parameters(), max_grad_norm)
                    optimizer.step()
                    optimizer.zero_grad()
                    scheduler.step()
                global_step += 1
                if checkpoint_path is not None and checkpoint_save_steps > 0 and global_step % checkpoint_save_steps == 0:
                    self._save_checkpoint(checkpoint_path, checkpoint_save_total_limit, global_step)
        if checkpoint_path is not None:
            self._save_checkpoint(checkpoint_path, checkpoint_save_total_limit, global_step)

    def _save_checkpoint(self, checkpoint_path, checkpoint_save_total_limit, step):
        # Store new checkpoint
        self.save(os.path.join(checkpoint_path, str(step)))  # BUG

        # Delete old checkpoints
        if checkpoint_save_total_limit is not None and checkpoint_save_total_limit > 0:
            old_checkpoints = []
            for subdir in os.listdir(checkpoint_path):
                if subdir.isdigit():
                    old_checkpoints.append({"step": int(subdir), "path": os.path.join(checkpoint_path, subdir)})
            if len(old_checkpoints) > checkpoint_save_total_limit:
                old_checkpoints = sorted(old_checkpoints, key=lambda x: x["step"])
                shutil.rmtree(old_checkpoints[0]["path"])


torch.manual_seed(0)


def make_batch():
    a = {"input_ids": torch.randint(0, 300, (16, 12))}
    b = {"input_ids": torch.randint(0, 300, (16, 12))}
    return [a, b], torch.rand(16)


train_dataloader = [make_batch() for _ in range(30)]
model = SentenceTransformer(TokenEmbedding())
train_loss = CosineSimilarityLoss(model)
checkpoint_dir = tempfile.mkdtemp()
try:
    model.fit(train_objectives=[(train_dataloader, train_loss)], epochs=2, warmup_steps=6,
              checkpoint_path=checkpoint_dir, checkpoint_save_steps=20, checkpoint_save_total_limit=2)
finally:
    shutil.rmtree(checkpoint_dir)
