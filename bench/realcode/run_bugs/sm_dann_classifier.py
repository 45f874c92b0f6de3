# Source: https://github.com/NaJaeMin92/pytorch-DANN/issues/7
# Original: NaJaeMin92/pytorch-DANN model.py (Classifier / Discriminator) and train.py
# Bug: the Classifier and Discriminator forwards return F.softmax(x), and train.py trains them with
# nn.CrossEntropyLoss, so softmax is applied twice; the fix returns the logits.
import torch
import torch.nn.functional as F

torch.manual_seed(0)


class GradReverse(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, alpha):
        ctx.alpha = alpha
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad.neg() * ctx.alpha, None


class Extractor(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(32, 48), torch.nn.ReLU())

    def forward(self, x):
        return self.net(x)


class Classifier(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(48, 10)

    def forward(self, x):
        return F.softmax(self.fc(x), dim=1)  # BUG


class Discriminator(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(48, 2)

    def forward(self, x, alpha):
        return F.softmax(self.fc(GradReverse.apply(x, alpha)), dim=1)


encoder, classifier, discriminator = Extractor(), Classifier(), Discriminator()
classifier_criterion, discriminator_criterion = torch.nn.CrossEntropyLoss(), torch.nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(list(encoder.parameters()) + list(classifier.parameters()) +
                            list(discriminator.parameters()), lr=0.01, momentum=0.9)
for step in range(40):
    source_image, source_label = torch.randn(16, 32), torch.randint(0, 10, (16,))
    target_image = torch.randn(16, 32) + 0.5
    combined_feature = encoder(torch.cat((source_image, target_image), 0))
    class_pred = classifier(combined_feature[:16])
    class_loss = classifier_criterion(class_pred, source_label)
    domain_pred = discriminator(combined_feature, 0.1)
    domain_combined_label = torch.cat((torch.zeros(16), torch.ones(16))).long()
    domain_loss = discriminator_criterion(domain_pred, domain_combined_label)
    total_loss = class_loss + domain_loss
    optimizer.zero_grad()
    total_loss.backward()
    optimizer.step()
print("done")
