# Source: https://github.com/NVIDIA/VariantWorks/pull/134
# Original: NVIDIA/VariantWorks variantworks/networks.py (ConsensusRNN.forward) and
# samples/simple_consensus_caller/rnn_consensus_trainer.py, read at ee2409a^
# Bug: ConsensusRNN ends its forward with F.softmax over the logits dimension, and the trainer feeds that output to
# NeMo's CrossEntropyLossNM (nn.CrossEntropyLoss over flattened positions), which applies log-softmax again; the
# outputs are smoothed and the gradient signal weakened. The fix returns the classifier's logits. NeMo's neural-module
# graph is replaced by a plain loop; our pileup features, labels and sizes are synthetic.
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)


class ConsensusRNN(nn.Module):
    def __init__(self, sequence_length, input_feature_size, num_output_logits):
        super().__init__()
        self.num_output_logits = num_output_logits
        self.gru = nn.GRU(input_feature_size, 16, 2, batch_first=True, bidirectional=True)
        self.classifier = nn.Linear(2 * 16, self.num_output_logits)

    def forward(self, encoding):
        encoding, h_n = self.gru(encoding)
        encoding = self.classifier(encoding)
        # Softmax along the logits dimension
        outputs = F.softmax(encoding, dim=2)  # BUG
        return outputs


class CrossEntropyLossNM(nn.Module):
    """Cross entropy over every position of a (batch, width, classes) output, as NeMo's logits_ndim=3 loss."""

    def __init__(self, logits_ndim=3):
        super().__init__()
        self._criterion = nn.CrossEntropyLoss()
        self._logits_dim = logits_ndim

    def forward(self, logits, labels):
        logits_flatten = torch.flatten(logits, start_dim=0, end_dim=-2)
        labels_flatten = torch.flatten(labels, start_dim=0, end_dim=-1)
        return self._criterion(logits_flatten, labels_flatten)


def pileups(n, width=20, features=10):
    """Summary pileup features; the label at each position is the base with the largest count."""
    counts = torch.rand(n, width, features)
    labels = counts[:, :, :5].argmax(-1)
    return TensorDataset(counts, labels)


def train():
    model = ConsensusRNN(sequence_length=20, input_feature_size=10, num_output_logits=5)
    train_dataset = DataLoader(pileups(256), batch_size=32, shuffle=True)
    vz_ce_loss = CrossEntropyLossNM(logits_ndim=3)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    step = 0
    for epoch in range(3):
        for encoding, vz_labels in train_dataset:
            vz = model(encoding=encoding)
            vz_loss = vz_ce_loss(logits=vz, labels=vz_labels)
            optimizer.zero_grad()
            vz_loss.backward()
            optimizer.step()
            if step % 8 == 0:
                acc = (vz.argmax(-1) == vz_labels).float().mean()
                print(f"Train Loss: {vz_loss.item():.4f}, Train Acc: {acc.item():.3f}")
            step += 1


train()
