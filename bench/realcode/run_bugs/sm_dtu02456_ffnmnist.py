"""Source: https://github.com/DeepLearningDTU/02456-deep-learning-with-PyTorch/commit/cef9173c63942bd3d7766890d2406a924b6c920f
("removed softmax")
Original: DeepLearningDTU/02456-deep-learning-with-PyTorch 3_Feedforward_PyTorch/3.4-EXE-FFN-MNIST.ipynb (the Net
cell, the optimizer/criterion cell and the training cell), read at cef9173^.
Bug: Net.forward returns F.softmax(x, dim=1) and the training loop feeds it to nn.CrossEntropyLoss, which applies
log_softmax itself: the loss sees probabilities as logits, is squeezed into [~1.46, ~2.46] for 10 classes and its
gradients shrink, so the network learns slowly. The fix returns the raw logits.
Theirs: the hand-written Parameter net with xavier init and ELU, SGD lr 0.1 with CrossEntropyLoss, the notebook's
training cell (slices of numpy arrays, Variable wrappers, zero_grad/backward/step, `cur_loss += batch_loss`, the
evaluation passes in net.eval() without no_grad, accuracy per epoch).
Ours: random 784-dimensional data with a learnable linear rule instead of mnist.npz (1000 train / 500 valid as
theirs), 4 epochs instead of 100, a numpy accuracy instead of sklearn.metrics.accuracy_score, no plots.
"""
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.nn.init as init
import torch.optim as optim
from torch.autograd import Variable
from torch.nn.parameter import Parameter

torch.manual_seed(0)
rng = np.random.RandomState(0)
proj = rng.normal(size=(784, 10)).astype('float32')
x_all = rng.normal(size=(1500, 784)).astype('float32')
t_all = (x_all @ proj).argmax(axis=1).astype('int32')
x_train, targets_train = x_all[:1000], t_all[:1000]
x_valid, targets_valid = x_all[1000:], t_all[1000:]


def accuracy_score(targets, preds):
    return float(np.mean(np.array(targets) == np.array(preds)))


#Hyperparameters
num_classes = 10
num_l1 = 512
num_features = x_train.shape[1]


# define network
class Net(nn.Module):

    def __init__(self, num_features, num_hidden, num_output):
        super().__init__()
        # input layer
        self.W_1 = Parameter(init.xavier_normal_(torch.Tensor(num_hidden, num_features)))
        self.b_1 = Parameter(init.constant_(torch.Tensor(num_hidden), 0))
        # hidden layer
        self.W_2 = Parameter(init.xavier_normal_(torch.Tensor(num_output, num_hidden)))
        self.b_2 = Parameter(init.constant_(torch.Tensor(num_output), 0))
        # define activation function in constructor
        self.activation = torch.nn.ELU()

    def forward(self, x):
        x = F.linear(x, self.W_1, self.b_1)
        x = self.activation(x)
        x = F.linear(x, self.W_2, self.b_2)
        return F.softmax(x, dim=1)  # BUG


net = Net(num_features, num_l1, num_classes)

optimizer = optim.SGD(net.parameters(), lr=0.1)
criterion = nn.CrossEntropyLoss()

# setting hyperparameters and gettings epoch sizes
batch_size = 100
num_epochs = 4
num_samples_train = x_train.shape[0]
num_batches_train = num_samples_train // batch_size
num_samples_valid = x_valid.shape[0]
num_batches_valid = num_samples_valid // batch_size

# setting up lists for handling loss/accuracy
train_acc, train_loss = [], []
valid_acc, valid_loss = [], []
cur_loss = 0
losses = []

get_slice = lambda i, size: range(i * size, (i + 1) * size)  # noqa: E731

for epoch in range(num_epochs):
    # Forward -> Backprob -> Update params
    ## Train
    cur_loss = 0
    net.train()
    for i in range(num_batches_train):
        slce = get_slice(i, batch_size)
        x_batch = Variable(torch.from_numpy(x_train[slce]))
        output = net(x_batch)

        # compute gradients given loss
        target_batch = Variable(torch.from_numpy(targets_train[slce]).long())
        batch_loss = criterion(output, target_batch)
        optimizer.zero_grad()
        batch_loss.backward()
        optimizer.step()

        cur_loss += batch_loss
    losses.append(cur_loss / batch_size)

    net.eval()
    ### Evaluate training
    train_preds, train_targs = [], []
    for i in range(num_batches_train):
        slce = get_slice(i, batch_size)
        x_batch = Variable(torch.from_numpy(x_train[slce]))

        output = net(x_batch)
        preds = torch.max(output, 1)[1]

        train_targs += list(targets_train[slce])
        train_preds += list(preds.data.numpy())

    ### Evaluate validation
    val_preds, val_targs = [], []
    for i in range(num_batches_valid):
        slce = get_slice(i, batch_size)
        x_batch = Variable(torch.from_numpy(x_valid[slce]))

        output = net(x_batch)
        preds = torch.max(output, 1)[1]
        val_preds += list(preds.data.numpy())
        val_targs += list(targets_valid[slce])

    train_acc_cur = accuracy_score(train_targs, train_preds)
    valid_acc_cur = accuracy_score(val_targs, val_preds)

    train_acc.append(train_acc_cur)
    valid_acc.append(valid_acc_cur)

    if epoch % 10 == 0:
        print("Epoch %2i : Train Loss %f , Train acc %f, Valid acc %f" % (  # noqa: UP031
                epoch+1, losses[-1], train_acc_cur, valid_acc_cur))
