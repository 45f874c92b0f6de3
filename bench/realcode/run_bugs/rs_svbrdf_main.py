# Source: https://github.com/mworchel/svbrdf-estimation/issues/31 (the author's own bug report, label bug)
# Original: mworchel/svbrdf-estimation development/multiImage_pytorch/main.py, read at 6716e31
# Bug: a training run saves model.state_dict() to model.data and the epoch to state.json; a later run with the same
# model directory loads the weights and the epoch and continues from there, but builds a fresh Adam: the optimizer
# state (and a scheduler, once used) is neither saved nor restored ("we do not store the optimizer (and scheduler)
# state right now. In order to continue training predictably, we should do so"). Ours: the script body as a main()
# run twice (2 epochs, then continued to 4) in a temporary model directory, a small conv encoder-decoder instead of
# SingleViewModel, an L1 loss instead of MixedLoss, random input images and SVBRDF maps, CPU instead of .cuda(); no
# tensorboard, no plotting.
import json
import math
import os
import tempfile

import torch
import torch.nn as nn


class SingleViewModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                                 nn.Conv2d(16, 12, 3, padding=1))

    def forward(self, inputs):
        return self.net(inputs[:, 0])


def main(model_dir, epochs, retrain=False, save_frequency=1):
    torch.manual_seed(0)
    # Create the model
    model = SingleViewModel()
    training_state = {'epoch': 0}

    # Load the model and training state on demand
    model_dir = os.path.abspath(model_dir)
    if not os.path.exists(model_dir):
        os.makedirs(model_dir)

    training_state_path = os.path.join(model_dir, "state.json")
    model_path = os.path.join(model_dir, "model.data")
    if os.path.exists(model_path):
        if not retrain:
            model.load_state_dict(torch.load(model_path))  # BUG
    else:
        print("No model found in the model directory. Performing retraining.")
        retrain = True

    if os.path.exists(training_state_path):
        if not retrain:
            with open(training_state_path) as f:
                training_state = json.load(f)
            print(f"Loaded training state: {training_state!s}.")

    data = [{"inputs": torch.rand(1, 3, 32, 32), "svbrdf": torch.rand(12, 32, 32)} for _ in range(48)]
    training_dataloader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)
    batch_count = int(math.ceil(len(data) / training_dataloader.batch_size))

    # Determine the epoch range
    epoch_start = training_state['epoch']
    epoch_end = epochs
    print(f"Training from epoch {epoch_start:d} to {epoch_end:d}")

    # Set up the optimizer and loss
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-5)
    loss_function = nn.L1Loss()

    model.train(True)
    for epoch in range(epoch_start, epoch_end):
        for i, batch in enumerate(training_dataloader):
            batch_index = epoch * batch_count + i
            batch_inputs = batch["inputs"]
            batch_svbrdf = batch["svbrdf"]

            # Perform a step
            optimizer.zero_grad()
            outputs = model(batch_inputs)
            loss = loss_function(outputs, batch_svbrdf)
            loss.backward()
            optimizer.step()
        print(f"Epoch {epoch + 1:d}, Batch {batch_index + 1:d}, loss: {loss.item():f}")

        if epoch % save_frequency == 0:
            torch.save(model.state_dict(), model_path)

            training_state['epoch'] = epoch
            with open(training_state_path, 'w') as f:
                json.dump(training_state, f)

    model.train(False)

    # Save a final snapshot of the model
    torch.save(model.state_dict(), model_path)
    training_state['epoch'] = epoch_end
    with open(training_state_path, 'w') as f:
        json.dump(training_state, f)
    return model, optimizer


if __name__ == "__main__":
    model_dir = os.path.join(tempfile.mkdtemp(), "models")
    main(model_dir, epochs=2)
    main(model_dir, epochs=4)
