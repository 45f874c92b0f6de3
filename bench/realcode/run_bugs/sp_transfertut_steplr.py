# Source: https://github.com/pytorch/tutorials/pull/640
# Original: pytorch/tutorials beginner_source/transfer_learning_tutorial.py (train_model)
# Bug: exp_lr_scheduler = StepLR(step_size=7, gamma=0.1) is meant per epoch but scheduler.step() runs in the
# batch loop, so the learning rate is divided by 10 every 7 batches; the PR moves it to once per epoch.
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=2), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                            torch.nn.Flatten(), torch.nn.Linear(8, 2))
criterion = torch.nn.CrossEntropyLoss()
optimizer_ft = torch.optim.SGD(model.parameters(), lr=0.001, momentum=0.9)
exp_lr_scheduler = torch.optim.lr_scheduler.StepLR(optimizer_ft, step_size=7, gamma=0.1)
dataloaders = {"train": [(torch.randn(4, 3, 16, 16), torch.randint(0, 2, (4,))) for _ in range(15)],
               "val": [(torch.randn(4, 3, 16, 16), torch.randint(0, 2, (4,))) for _ in range(4)]}


def train_model(model, criterion, optimizer, scheduler, num_epochs=5):
    for epoch in range(num_epochs):
        for phase in ["train", "val"]:
            model.train(phase == "train")
            running_corrects = 0
            for inputs, labels in dataloaders[phase]:
                optimizer.zero_grad()
                with torch.set_grad_enabled(phase == "train"):
                    outputs = model(inputs)
                    loss = criterion(outputs, labels)
                    if phase == "train":
                        loss.backward()
                        optimizer.step()
                        scheduler.step()  # BUG
                running_corrects += int((outputs.argmax(1) == labels).sum())
            print(epoch, phase, running_corrects)
    return model


train_model(model, criterion, optimizer_ft, exp_lr_scheduler)
