"""Source: https://github.com/fishaudio/fish-speech/commit/4b8eac9b6b745e6477df7d25b8a0729fabd4affe ("Fix agent nan loss")
Original: fishaudio/fish-speech fish_speech/models/text2semantic/lit_module.py (TextToSemantic._step) and
fish_speech/models/text2semantic/llama.py (DualARTransformer.forward), read at 4b8eac9^.
Bug: the agent data mixes text-only samples into training. When every codebook position of a batch is padding,
DualARTransformer drops all rows before the fast transformer, the re-padded codebook logits are all zeros and
every codebook label is -100, so the semantic cross-entropy averages over zero targets: 0 / 0 = NaN, and the
summed loss is NaN. The fix keeps the first 8 rows in the model so the loss always has targets.
Theirs: the Lightning module's _step (two cross-entropies with ignore_index=-100, summed), configure_optimizers
with an interval "step" scheduler, the dual-AR forward that removes padded rows and re-pads the logits.
Ours: a tiny slow transformer (embedding + one encoder layer), one linear fast layer instead of their fast
transformer blocks, F.cross_entropy instead of their Triton fast_cross_entropy_loss, random token batches where
the fifth batch is text-only (as an agent text sample is), a 12-step Lightning run on CPU.
"""
from dataclasses import dataclass

import lightning as L
import torch
import torch.nn.functional as F
from einops import rearrange

CODEBOOK_PAD_TOKEN_ID = 0


@dataclass
class ModelArgs:
    vocab_size: int = 64
    codebook_size: int = 32
    num_codebooks: int = 4
    dim: int = 32
    codebook_padding_idx: int = CODEBOOK_PAD_TOKEN_ID


@dataclass
class TransformerForwardResult:
    token_logits: torch.Tensor
    codebook_logits: torch.Tensor


class DualARTransformer(torch.nn.Module):
    def __init__(self, config: ModelArgs):
        super().__init__()
        self.config = config
        self.embeddings = torch.nn.Embedding(config.vocab_size, config.dim)
        self.codebook_embeddings = torch.nn.Embedding(config.codebook_size * config.num_codebooks, config.dim)
        self.slow_layer = torch.nn.TransformerEncoderLayer(config.dim, 4, 64, dropout=0.0, batch_first=True)
        self.output = torch.nn.Linear(config.dim, config.vocab_size)
        self.fast_embeddings = torch.nn.Embedding(config.codebook_size, config.dim)
        self.fast_layers = torch.nn.ModuleList([torch.nn.Linear(config.dim, config.dim)])
        self.fast_norm = torch.nn.LayerNorm(config.dim)
        self.fast_output = torch.nn.Linear(config.dim, config.codebook_size)

    def forward(self, inp, key_padding_mask=None):
        x = self.embeddings(inp[:, 0]) + self.codebook_embeddings(inp[:, 1:]).sum(dim=1)
        x = self.slow_layer(x, src_key_padding_mask=key_padding_mask)
        token_logits = self.output(x)

        # Drop the last token and rotate left
        codebooks = inp[:, 1:-1, 1:]
        codebooks = F.pad(codebooks, (0, 1), value=self.config.codebook_padding_idx)
        codebook_embeddings = self.fast_embeddings(codebooks)
        x = torch.cat([x[:, None], codebook_embeddings], dim=1)
        b, s = x.size(0), x.size(2)
        x = rearrange(x, "b n s d -> (b s) n d")

        # Remove padded part
        codebooks = rearrange(codebooks, "b n s -> (b s) n")
        codebook_mask = (codebooks == self.config.codebook_padding_idx).all(dim=-1)
        x_bs, x_len = x.size(0), x.size(1)
        x = x[~codebook_mask]

        for layer in self.fast_layers:
            x = torch.nn.functional.silu(layer(x))

        fast_out = self.fast_norm(x)
        codebook_logits = self.fast_output(fast_out)

        # Re-pad the codebook_logits
        buffer = torch.zeros(x_bs, x_len, codebook_logits.size(-1), dtype=codebook_logits.dtype)
        buffer[~codebook_mask] = codebook_logits
        codebook_logits = buffer
        codebook_logits = rearrange(codebook_logits, "(b s) n d -> b s n d", b=b, s=s,
                                    n=self.config.num_codebooks)
        return TransformerForwardResult(token_logits=token_logits, codebook_logits=codebook_logits)


class TextToSemantic(L.LightningModule):
    def __init__(self, model, optimizer, lr_scheduler):
        super().__init__()
        self.model = model
        self.optimizer_builder = optimizer
        self.lr_scheduler_builder = lr_scheduler

    def configure_optimizers(self):
        weight_decay_parameters, other_parameters = [], []
        for name, param in self.named_parameters():
            if ".bias" in name or "norm.weight" in name or ".embeddings." in name:
                other_parameters.append(param)
            else:
                weight_decay_parameters.append(param)
        optimizer = self.optimizer_builder([
            {"params": weight_decay_parameters},
            {"params": other_parameters, "weight_decay": 0.0},
        ])
        lr_scheduler = self.lr_scheduler_builder(optimizer)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": lr_scheduler, "interval": "step"}}

    def _step(self, batch, batch_idx, stage: str):
        is_train = stage == "train"
        if is_train:
            self.model.train()
        labels = batch["labels"]
        outputs = self.model(inp=batch["inputs"], key_padding_mask=batch["attention_masks"])
        token_logits = outputs.token_logits
        codebook_logits = outputs.codebook_logits

        base_loss = F.cross_entropy(
            token_logits.view(-1, token_logits.size(-1)),
            labels[:, 0].reshape(-1),
            ignore_index=-100,
        )
        codebook_labels = labels[:, 1: 1 + self.model.config.num_codebooks].mT
        semantic_loss = F.cross_entropy(codebook_logits.view(-1, codebook_logits.size(-1)), codebook_labels.reshape(-1), ignore_index=-100)  # BUG
        loss = base_loss + semantic_loss
        self.log(f"{stage}/loss", loss, on_step=is_train, on_epoch=not is_train, prog_bar=True, logger=True)
        self.log(f"{stage}/semantic_loss", semantic_loss, on_step=is_train, on_epoch=not is_train,
                 prog_bar=False, logger=True)
        return loss

    def training_step(self, batch, batch_idx):
        return self._step(batch, batch_idx, "train")


def make_batch(g, config, text_only, bsz=4, seq=12):
    inputs = torch.randint(1, config.vocab_size, (bsz, 1 + config.num_codebooks, seq), generator=g)
    inputs[:, 1:] = torch.randint(1, config.codebook_size, (bsz, config.num_codebooks, seq), generator=g)
    labels = inputs.clone()
    if text_only:
        inputs[:, 1:] = CODEBOOK_PAD_TOKEN_ID
        labels[:, 1:] = -100
    return {"inputs": inputs, "labels": labels, "attention_masks": torch.zeros(bsz, seq, dtype=torch.bool)}


if __name__ == "__main__":
    torch.manual_seed(0)
    config = ModelArgs()
    g = torch.Generator().manual_seed(1)
    batches = [make_batch(g, config, text_only=(i == 4)) for i in range(12)]
    module = TextToSemantic(
        DualARTransformer(config),
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01),
        lr_scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / 4)),
    )
    trainer = L.Trainer(max_steps=12, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, train_dataloaders=torch.utils.data.DataLoader(batches, batch_size=None))
