"""Data parallelism from scratch whose allreduce never writes the summed gradient back into the other replicas.

Source: https://github.com/d2l-ai/d2l-en/commit/f51ed98d8a93441d678110fa5a6f086bf16499f2
("[PyTorch] Fix data synchronization", merged as #1978), read at its parent f51ed98d^
(chapter_computational-performance/multiple-gpus.md, PyTorch tab; d2l/torch.py for sgd).

Theirs: the LeNet parameters and lenet(), get_params, allreduce, train_batch and train as in the
book at that commit (one process, one parameter replica per device, gradients summed by hand).
Ours: two CPU "devices" instead of two GPUs, so get_params clones each tensor (p.to(cpu) would
return the very same tensor and the replicas would share storage) and split_batch uses
torch.chunk (nn.parallel.scatter refuses CPU devices); random Fashion-MNIST-shaped batches
instead of load_data_fashion_mnist; 2 epochs of 8 batches of 64 (theirs: 10 epochs); no
Animator/Timer, the accuracy of replica 0 measured on one training batch; `l` renamed (lint).

The bug: the second loop of allreduce rebinds the list slot (`data[i] = ...`) instead of writing
into the gradient tensor (`data[i][:] = ...`), so replica 0 gets the sum of all gradients while
every other replica keeps only its own shard's gradient: after the first update the replicas hold
different weights and drift further apart every step.
"""
import torch
from torch import nn
from torch.nn import functional as F

# Initialize model parameters
scale = 0.01
W1 = torch.randn(size=(20, 1, 3, 3)) * scale
b1 = torch.zeros(20)
W2 = torch.randn(size=(50, 20, 5, 5)) * scale
b2 = torch.zeros(50)
W3 = torch.randn(size=(800, 128)) * scale
b3 = torch.zeros(128)
W4 = torch.randn(size=(128, 10)) * scale
b4 = torch.zeros(10)
params = [W1, b1, W2, b2, W3, b3, W4, b4]


# Define the model
def lenet(X, params):
    h1_conv = F.conv2d(input=X, weight=params[0], bias=params[1])
    h1_activation = F.relu(h1_conv)
    h1 = F.avg_pool2d(input=h1_activation, kernel_size=(2, 2), stride=(2, 2))
    h2_conv = F.conv2d(input=h1, weight=params[2], bias=params[3])
    h2_activation = F.relu(h2_conv)
    h2 = F.avg_pool2d(input=h2_activation, kernel_size=(2, 2), stride=(2, 2))
    h2 = h2.reshape(h2.shape[0], -1)
    h3_linear = torch.mm(h2, params[4]) + params[5]
    h3 = F.relu(h3_linear)
    y_hat = torch.mm(h3, params[6]) + params[7]
    return y_hat


# Cross-entropy loss function
loss = nn.CrossEntropyLoss(reduction='none')


def sgd(params, lr, batch_size):
    """Minibatch stochastic gradient descent."""
    with torch.no_grad():
        for param in params:
            param -= lr * param.grad / batch_size
            param.grad.zero_()


def get_params(params, device):
    new_params = [p.to(device).clone() for p in params]
    for p in new_params:
        p.requires_grad_()
    return new_params


def allreduce(data):
    for i in range(1, len(data)):
        data[0][:] += data[i].to(data[0].device)
    for i in range(1, len(data)):
        data[i] = data[0].to(data[i].device)  # BUG


def split_batch(X, y, devices):
    """Split `X` and `y` into multiple devices."""
    assert X.shape[0] == y.shape[0]
    return ([x.to(d) for x, d in zip(X.chunk(len(devices)), devices)],
            [t.to(d) for t, d in zip(y.chunk(len(devices)), devices)])


def train_batch(X, y, device_params, devices, lr):
    X_shards, y_shards = split_batch(X, y, devices)
    # Loss is calculated separately on each GPU
    ls = [loss(lenet(X_shard, device_W), y_shard).sum()
          for X_shard, y_shard, device_W in zip(
              X_shards, y_shards, device_params)]
    for loss_value in ls:  # Backpropagation is performed separately on each GPU
        loss_value.backward()
    # Sum all gradients from each GPU and broadcast them to all GPUs
    with torch.no_grad():
        for i in range(len(device_params[0])):
            allreduce([device_params[c][i].grad for c in range(len(devices))])
    # The model parameters are updated separately on each GPU
    for param in device_params:
        sgd(param, lr, X.shape[0])  # Here, we use a full-size batch


def train(num_gpus, batch_size, lr, train_iter):
    devices = [torch.device('cpu') for i in range(num_gpus)]
    # Copy model parameters to `num_gpus` GPUs
    device_params = [get_params(params, d) for d in devices]
    num_epochs = 2
    for epoch in range(num_epochs):
        for X, y in train_iter:
            # Perform multi-GPU training for a single minibatch
            train_batch(X, y, device_params, devices, lr)
        # Evaluate the model on GPU 0
        with torch.no_grad():
            X, y = next(iter(train_iter))
            acc = float((lenet(X, device_params[0]).argmax(dim=1) == y).float().mean())
        print(f'epoch {epoch + 1}: acc {acc:.2f} on {devices}')


if __name__ == "__main__":
    torch.manual_seed(0)
    images = torch.randn(8 * 64, 1, 28, 28)
    labels = torch.randint(0, 10, (8 * 64,))
    train_iter = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(images, labels), batch_size=64, shuffle=True)
    train(num_gpus=2, batch_size=64, lr=0.2, train_iter=train_iter)
