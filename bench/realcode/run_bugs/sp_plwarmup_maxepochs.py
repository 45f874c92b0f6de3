# Source: https://github.com/Lightning-AI/pytorch-lightning/issues/18570
# Original: the configure_optimizers quoted in the issue (transformers' get_linear_schedule_with_warmup with
# num_training_steps=self.trainer.max_epochs, stepped with interval "step"; a maintainer pointed at the mismatch)
# Bug: the linear decay is sized in epochs but Lightning steps it every optimizer step, so it reaches zero after
# max_epochs batches and the rest of the run trains with a learning rate of 0.
import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from transformers import get_linear_schedule_with_warmup

torch.manual_seed(0)


class TextClassifier(pl.LightningModule):
    def __init__(self, n_warmup_steps=10, lr=2e-3):
        super().__init__()
        self.n_warmup_steps = n_warmup_steps
        self.lr = lr
        self.emb = torch.nn.EmbeddingBag(200, 32)
        self.head = torch.nn.Linear(32, 4)

    def training_step(self, batch, batch_idx):
        tokens, labels = batch
        loss = F.cross_entropy(self.head(self.emb(tokens)), labels)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.lr)
        scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=self.n_warmup_steps,
                                                    num_training_steps=self.trainer.max_epochs)  # BUG
        return dict(optimizer=optimizer, lr_scheduler=dict(scheduler=scheduler, interval="step", frequency=1))


tokens = torch.randint(0, 200, (640, 12))
labels = tokens[:, 0] % 4
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(tokens, labels), batch_size=16, shuffle=True)
model = TextClassifier()
trainer = pl.Trainer(max_epochs=20, accelerator="cpu", logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False, limit_train_batches=8)
trainer.fit(model, loader)
print("final lr", trainer.optimizers[0].param_groups[0]["lr"])
