# Source: https://github.com/amoudgl/pygoturn/issues/16 (fixed by e865ce6, "Fixes #16")
# Original: amoudgl/pygoturn src/train.py (train_model, exp_lr_scheduler, get_training_batch), read at e865ce6^
# Bug: train_model checks `itr % lr_decay_step == 0` at the top of every pass of its while loop, but itr only
# advances when get_training_batch has filled a whole batch (every few passes, 11 samples per image into batches of
# 50); while itr sits on a multiple of lr_decay_step the learning rate is multiplied by gamma again on every pass,
# so each scheduled decay happens several times (the reporter: "the lr will continue decreasing until done==1";
# the maintainer moved the check under `if done:`). Ours: a tiny two-branch GoNet on random 3x32x32 frames instead of
# AlexNet on 227x227 crops, synthetic samples instead of ALOV/ImageNet, 20 batches with lr_decay_step 5, CPU.
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim

batchSize = 50  # number of samples in a batch
kGeneratedExamplesPerImage = 10  # generate 10 synthetic samples per image in a dataset


class Args:
    num_batches = 20
    learning_rate = 1e-3
    gamma = 0.1
    momentum = 0.9
    weight_decay = 0.0005
    lr_decay_step = 5


args = Args()


class GoNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 5, stride=2), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten())
        self.classifier = nn.Sequential(nn.Linear(2 * 8 * 16, 64), nn.ReLU(), nn.Linear(64, 4))

    def forward(self, x, y):
        return self.classifier(torch.cat((self.features(x), self.features(y)), 1))


def exp_lr_scheduler(optimizer, step, init_lr, gamma, snapshot=50000):
    """Decay learning rate by a factor of 0.1 every lr_decay_epoch epochs."""
    lr = init_lr * gamma
    if step % snapshot == 0:
        print(f'LR is set to {lr}')

    for param_group in optimizer.param_groups:
        param_group['lr'] = lr

    return optimizer, lr


def make_transformed_samples(dataset, args):
    n = kGeneratedExamplesPerImage + 1
    return torch.rand(n, 3, 32, 32), torch.rand(n, 3, 32, 32), torch.rand(n, 4) * 10


def get_training_batch(running_batch_idx, running_batch, dataset):
    done = 0
    N = kGeneratedExamplesPerImage + 1
    train_batch = None

    x1_batch, x2_batch, y_batch = make_transformed_samples(dataset, args)
    if running_batch_idx + N <= batchSize:
        running_batch['previmg'][running_batch_idx:running_batch_idx + N, :, :, :] = x1_batch
        running_batch['currimg'][running_batch_idx:running_batch_idx + N, :, :, :] = x2_batch
        running_batch['currbb'][running_batch_idx:running_batch_idx + N, :] = y_batch
        running_batch_idx = (running_batch_idx + N)
    elif running_batch_idx + N > batchSize:
        done = 1
        count_in = batchSize - running_batch_idx
        if count_in > 0:
            running_batch['previmg'][running_batch_idx:running_batch_idx + count_in, :, :, :] = x1_batch[:count_in]
            running_batch['currimg'][running_batch_idx:running_batch_idx + count_in, :, :, :] = x2_batch[:count_in]
            running_batch['currbb'][running_batch_idx:running_batch_idx + count_in, :] = y_batch[:count_in, :]
            running_batch_idx = (running_batch_idx + N) % batchSize
            train_batch = running_batch
            running_batch = {'previmg': torch.Tensor(batchSize, 3, 32, 32),
                             'currimg': torch.Tensor(batchSize, 3, 32, 32),
                             'currbb': torch.Tensor(batchSize, 4)}
            running_batch['previmg'][:running_batch_idx, :, :, :] = x1_batch[count_in:, :, :, :]
            running_batch['currimg'][:running_batch_idx, :, :, :] = x2_batch[count_in:, :, :, :]
            running_batch['currbb'][:running_batch_idx, :] = y_batch[count_in:, :]
        else:
            train_batch = running_batch
            running_batch_idx = 0
            running_batch['previmg'][running_batch_idx:running_batch_idx + N, :, :, :] = x1_batch
            running_batch['currimg'][running_batch_idx:running_batch_idx + N, :, :, :] = x2_batch
            running_batch['currbb'][running_batch_idx:running_batch_idx + N, :] = y_batch
            running_batch_idx = (running_batch_idx + N)

    return running_batch, train_batch, done, running_batch_idx


def train_model(model, datasets, criterion, optimizer):
    curr_loss = 0
    lr = args.learning_rate
    running_batch_idx = 0
    running_batch = {'previmg': torch.Tensor(batchSize, 3, 32, 32),
                     'currimg': torch.Tensor(batchSize, 3, 32, 32),
                     'currbb': torch.Tensor(batchSize, 4)}

    itr = 0
    while itr < args.num_batches:

        model.train()
        if itr > 0 and itr % args.lr_decay_step == 0:
            optimizer, lr = exp_lr_scheduler(optimizer, itr, lr, args.gamma)  # BUG

        # train on datasets
        # usually ALOV and ImageNet
        for i, dataset in enumerate(datasets):

            running_batch, train_batch, done, running_batch_idx = get_training_batch(running_batch_idx, running_batch,
                                                                                     dataset)
            if done:
                x1 = train_batch['previmg']
                x2 = train_batch['currimg']
                y = train_batch['currbb']

                # zero the parameter gradients
                optimizer.zero_grad()

                # forward
                output = model(x1, x2)
                loss = criterion(output, y)

                # backward + optimize
                loss.backward()
                optimizer.step()

                # statistics
                curr_loss = loss.item()
                itr = itr + 1
                print('[training] step = %d/%d, loss = %f, lr = %g' % (itr, args.num_batches, curr_loss, lr))  # noqa: UP031
                sys.stdout.flush()
    return model


def main():
    np.random.seed(800)
    torch.manual_seed(800)
    datasets = ['alov', 'imagenet']
    net = GoNet()
    loss_fn = torch.nn.L1Loss(reduction='sum')

    trainable_weights = []
    trainable_bias = []
    for name, param in net.classifier.named_parameters():
        if 'weight' in name:
            trainable_weights.append(param)
        elif 'bias' in name:
            trainable_bias.append(param)

    optimizer = optim.SGD(
        [
            {'params': trainable_weights, 'lr': args.learning_rate * 10},
            {'params': trainable_bias, 'lr': args.learning_rate * 20},
        ],
        lr=args.learning_rate,
        momentum=args.momentum,
        weight_decay=args.weight_decay
    )
    train_model(net, datasets, loss_fn, optimizer)


if __name__ == '__main__':
    main()
