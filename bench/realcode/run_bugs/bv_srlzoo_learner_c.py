# Source: https://github.com/araffin/robotics-rl-srl/issues/48
# Original: araffin/srl-zoo (the robotics-rl-srl submodule) models/learner.py (SRL4robotics.learn), read at 438a05a
# Bug: learn() draws 20% of its shuffled minibatches as validation batches and interleaves them with the training
# batches; on a validation batch it switches the model to eval() but still calls loss.backward() ("We have to call
# backward in both train/val to avoid memory error"), skipping only optimizer.step(). The issue (open) reports that
# the validation set is used in the gradient computation during training. Ours: a small conv autoencoder with the
# reconstruction loss only (their LossManager kept, the priors and triplet/VAE branches dropped), random 32x32
# observations instead of the image DataLoader, 3 epochs.
from collections import defaultdict

import numpy as np
import torch as th
import torch.nn as nn

th.manual_seed(0)
np.random.seed(0)

VALIDATION_SIZE = 0.2  # 20% of training data for validation
N_EPOCHS = 3
BATCH_SIZE = 16


class LossManager:
    def __init__(self, model, loss_history=None):
        self.model = model
        self.reg_params = []
        self.loss_history = loss_history
        self.names, self.weights, self.losses = [], [], []

    def addToLosses(self, name, weight, loss_value):
        self.names.append(name)
        self.weights.append(weight)
        self.losses.append(loss_value)

    def resetLosses(self):
        self.names, self.weights, self.losses = [], [], []

    def updateLossHistory(self):
        if self.loss_history is not None:
            for name, w, loss in zip(self.names, self.weights, self.losses):
                self.loss_history[name].append(w * loss.item())

    def computeTotalLoss(self):
        return sum(w * loss for w, loss in zip(self.weights, self.losses))


def autoEncoderLoss(obs, decoded_obs, next_obs, decoded_next_obs, weight, loss_manager):
    criterion = nn.MSELoss(reduction='sum')
    ae_loss = criterion(decoded_obs, obs) + criterion(decoded_next_obs, next_obs)
    loss_manager.addToLosses('reconstruction_loss', weight, ae_loss)
    return weight * ae_loss


class CNNAutoEncoder(nn.Module):
    def __init__(self, state_dim=8):
        super().__init__()
        self.encoder = nn.Sequential(nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                                     nn.Conv2d(16, 8, 3, stride=2, padding=1), nn.Flatten(), nn.Linear(8 * 8 * 8, state_dim))
        self.decoder = nn.Sequential(nn.Linear(state_dim, 8 * 8 * 8), nn.Unflatten(1, (8, 8, 8)), nn.ReLU(),
                                     nn.ConvTranspose2d(8, 16, 4, stride=2, padding=1), nn.ReLU(),
                                     nn.ConvTranspose2d(16, 3, 4, stride=2, padding=1))

    def forward(self, x):
        states = self.encoder(x)
        return states, self.decoder(states)


class SRL4robotics:
    def __init__(self, state_dim=8, learning_rate=1e-3, batch_size=BATCH_SIZE):
        self.batch_size = batch_size
        self.device = th.device("cpu")
        self.model = CNNAutoEncoder(state_dim).to(self.device)
        self.optimizer = th.optim.Adam(self.model.parameters(), lr=learning_rate)
        self.losses_weights_dict = {'autoencoder': 1.0}

    def learn(self, observations, episode_starts):
        num_samples = len(observations) - 1
        indices = np.array([i for i in range(num_samples) if not episode_starts[i + 1]], dtype='int64')
        np.random.shuffle(indices)
        minibatchlist = [np.array(sorted(indices[start_idx:start_idx + self.batch_size]))
                         for start_idx in range(0, len(indices) - self.batch_size + 1, self.batch_size)]

        # Number of minibatches used for validation:
        n_val_batches = np.round(VALIDATION_SIZE * len(minibatchlist)).astype(np.int64)
        val_indices = np.random.permutation(len(minibatchlist))[:n_val_batches]
        assert n_val_batches > 0, "Not enough sample to create a validation set"

        loss_history = defaultdict(list)
        loss_manager = LossManager(self.model, loss_history)

        for epoch in range(N_EPOCHS):
            epoch_loss, epoch_batches = 0, 0
            val_loss = 0
            for minibatch_idx in np.random.permutation(len(minibatchlist)):
                obs = observations[minibatchlist[minibatch_idx]].to(self.device)
                next_obs = observations[minibatchlist[minibatch_idx] + 1].to(self.device)

                validation_mode = minibatch_idx in val_indices
                if validation_mode:
                    self.model.eval()
                else:
                    self.model.train()

                self.optimizer.zero_grad()
                loss_manager.resetLosses()

                (states, decoded_obs), (next_states, decoded_next_obs) = self.model(obs), self.model(next_obs)
                autoEncoderLoss(obs, decoded_obs, next_obs, decoded_next_obs,
                                weight=self.losses_weights_dict['autoencoder'], loss_manager=loss_manager)

                loss_manager.updateLossHistory()
                loss = loss_manager.computeTotalLoss()

                # We have to call backward in both train/val
                # to avoid memory error
                loss.backward()  # BUG
                if validation_mode:
                    val_loss += loss.item()
                    # We do not optimize on validation data
                    # so optimizer.step() is not called
                else:
                    self.optimizer.step()
                    epoch_loss += loss.item()
                    epoch_batches += 1

            train_loss = epoch_loss / float(epoch_batches)
            val_loss /= float(n_val_batches)
            print(f"Epoch {epoch + 1:3}/{N_EPOCHS}, train_loss:{train_loss:.4f} val_loss:{val_loss:.4f}")
        return self.model


if __name__ == '__main__':
    observations = th.rand(401, 3, 32, 32)
    episode_starts = np.zeros(401, dtype=bool)
    episode_starts[::100] = True
    srl = SRL4robotics()
    srl.learn(observations, episode_starts)
