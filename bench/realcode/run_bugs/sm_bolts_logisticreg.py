# Source: https://github.com/Lightning-Universe/lightning-bolts/issues/654
# Original: Lightning-Universe/lightning-bolts pl_bolts/models/regression/logistic_regression.py (LogisticRegression)
# Bug: forward returns softmax probabilities and training_step feeds them to cross_entropy, which applies
# log_softmax again: the loss is bounded away from 0 and its gradients shrink as the model grows confident.
import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)


class LogisticRegression(pl.LightningModule):
    def __init__(self, input_dim, num_classes, learning_rate=1e-2):
        super().__init__()
        self.learning_rate = learning_rate
        self.linear = torch.nn.Linear(input_dim, num_classes)

    def forward(self, x):
        x = self.linear(x)
        return F.softmax(x, dim=-1)  # BUG

    def training_step(self, batch, batch_idx):
        x, y = batch
        x = x.view(x.size(0), -1)
        y_hat = self(x)
        loss = F.cross_entropy(y_hat, y, reduction="sum")
        self.log("train_loss", loss, prog_bar=False)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.learning_rate)


x = torch.randn(640, 20)
y = (x[:, :5].sum(1) > 0).long() + 2 * (x[:, 5:10].sum(1) > 0).long()
loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)
model = LogisticRegression(input_dim=20, num_classes=4)
trainer = pl.Trainer(max_epochs=4, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False)
trainer.fit(model, loader)
print("done", float(trainer.callback_metrics["train_loss"]))
