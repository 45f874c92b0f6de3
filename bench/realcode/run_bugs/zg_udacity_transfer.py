# Source: https://github.com/udacity/deep-learning-v2-pytorch/pull/160
# Original: udacity/deep-learning-v2-pytorch transfer-learning notebook (training cell)
# Bug: the training cell runs forward, backward and optimizer.step() per batch without zeroing the gradients
# of the classifier it trains; the PR adds optimizer.zero_grad().
import torch

torch.manual_seed(0)
features = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                               torch.nn.Flatten())
for p in features.parameters():
    p.requires_grad = False
classifier = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2),
                                 torch.nn.LogSoftmax(dim=1))
model = torch.nn.Sequential(features, classifier)
criterion = torch.nn.NLLLoss()
optimizer = torch.optim.Adam(classifier.parameters(), lr=0.003)
trainloader = [(torch.randn(8, 3, 16, 16), torch.randint(0, 2, (8,))) for _ in range(30)]
steps = 0
running_loss = 0.0
for inputs, labels in trainloader:
    steps += 1
    logps = model(inputs)
    loss = criterion(logps, labels)
    loss.backward()  # BUG
    optimizer.step()
    running_loss += loss.item()
print("train loss", running_loss / steps)
