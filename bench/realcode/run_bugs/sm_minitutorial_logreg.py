# Source: https://github.com/vinhkhuc/PyTorch-Mini-Tutorials/issues/1
# Original: vinhkhuc/PyTorch-Mini-Tutorials 2_logistic_regression.py (build_model / train)
# Bug: the Sequential model ends with nn.Softmax() and train() feeds its output to
# torch.nn.CrossEntropyLoss, which applies log-softmax again.
import torch

torch.manual_seed(0)


def build_model(input_dim, output_dim):
    model = torch.nn.Sequential()
    model.add_module("linear", torch.nn.Linear(input_dim, output_dim, bias=False))
    model.add_module("softmax", torch.nn.Softmax(dim=1))  # BUG
    return model


def train(model, loss, optimizer, x_val, y_val):
    optimizer.zero_grad()
    fx = model.forward(x_val)
    output = loss.forward(fx, y_val)
    output.backward()
    optimizer.step()
    return output.item()


model = build_model(64, 10)
loss = torch.nn.CrossEntropyLoss(reduction="mean")
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
trX, trY = torch.randn(640, 64), torch.randint(0, 10, (640,))
for i in range(3):
    cost = 0.0
    for k in range(0, 640, 32):
        cost += train(model, loss, optimizer, trX[k:k + 32], trY[k:k + 32])
    print("epoch", i, cost / 20)
