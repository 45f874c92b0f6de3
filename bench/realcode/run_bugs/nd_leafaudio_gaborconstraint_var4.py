# Source: https://github.com/denfed/leaf-audio-pytorch/issues/3 (variant of nd_leafaudio_gaborconstraint, run13c)
# Original: none (a variant): the same family in another shape, a Lightning 2.x module with an auxiliary
# reconstruction decoder whose loss is logged and added to the training loss; synthetic data
# Bug: the auxiliary term is rebuilt with torch.tensor(aux.item()) (to log a float and "add it back"), a constant: the
# decoder is reached by no gradient and never trains, while the total loss still looks like it includes it.
import lightning as L
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset


class AuxModule(L.LightningModule):
    def __init__(self, aux_weight=0.5):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(20, 32), nn.ReLU())
        self.classifier = nn.Linear(32, 3)
        self.decoder = nn.Linear(32, 20)
        self.aux_weight = aux_weight

    def training_step(self, batch, batch_idx):
        x, y = batch
        h = self.encoder(x)
        ce = F.cross_entropy(self.classifier(h), y)
        aux = F.mse_loss(self.decoder(h), x)
        self.log("aux", aux.item())
        aux = torch.tensor(aux.item())  # BUG
        return ce + self.aux_weight * aux

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


torch.manual_seed(0)
x = torch.randn(192, 20)
y = (x[:, 0] > 0).long() + (x[:, 1] > 1).long()
model = AuxModule()
trainer = L.Trainer(max_epochs=3, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False)
trainer.fit(model, DataLoader(TensorDataset(x, y), batch_size=16))
print("decoder grad", model.decoder.weight.grad)
