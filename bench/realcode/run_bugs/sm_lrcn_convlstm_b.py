# Source: https://github.com/doronharitan/human_activity_recognition_LRCN/issues/4
# Original: doronharitan/human_activity_recognition_LRCN LRCN/lrcn_model.py (ConvLstm) and
# utils_action_recognition.py (foward_step, train_model), read at efce680
# Bug: ConvLstm's output layer ends in nn.Softmax(dim=-1), and train.py feeds those probabilities to
# nn.CrossEntropyLoss, which applies log-softmax again; the loss is squashed towards log(n_class) and the gradient
# signal weakened (a commenter confirmed that removing the softmax made the model converge faster).
# Ours: a tiny conv encoder instead of the frozen pretrained resnet152, synthetic clips and labels, 3 epochs.
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)


class ConvLstm(nn.Module):
    def __init__(self, latent_dim, hidden_size, lstm_layers, bidirectional, n_class):
        super().__init__()
        self.conv_model = Pretrained_conv(latent_dim)
        self.Lstm = Lstm(latent_dim, hidden_size, lstm_layers, bidirectional)
        self.output_layer = nn.Sequential(
            nn.Linear(2 * hidden_size if bidirectional == True else hidden_size, n_class),  # noqa: E712
            nn.Softmax(dim=-1)  # BUG
        )

    def forward(self, x):
        batch_size, timesteps, channel_x, h_x, w_x = x.shape
        conv_input = x.view(batch_size * timesteps, channel_x, h_x, w_x)
        conv_output = self.conv_model(conv_input)
        lstm_input = conv_output.view(batch_size, timesteps, -1)
        lstm_output = self.Lstm(lstm_input)
        lstm_output = lstm_output[:, -1, :]
        output = self.output_layer(lstm_output)
        return output


class Pretrained_conv(nn.Module):
    def __init__(self, latent_dim):
        super().__init__()
        self.conv_model = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU(),
                                        nn.AdaptiveAvgPool2d(1), nn.Flatten())
        for param in self.conv_model.parameters():
            param.requires_grad = False
        self.fc = nn.Linear(8, latent_dim)

    def forward(self, x):
        return self.fc(self.conv_model(x))


class Lstm(nn.Module):
    def __init__(self, latent_dim, hidden_size, lstm_layers, bidirectional):
        super().__init__()
        self.Lstm = nn.LSTM(latent_dim, hidden_size=hidden_size, num_layers=lstm_layers, batch_first=True,
                            bidirectional=bidirectional)
        self.hidden_state = None

    def reset_hidden_state(self):
        self.hidden_state = None

    def forward(self, x):
        output, self.hidden_state = self.Lstm(x, self.hidden_state)
        return output


def foward_step(model, images, labels, criterion, mode=''):
    # Must be done before you run a new batch. Otherwise the LSTM will treat a new batch as a continuation of a sequence
    model.Lstm.reset_hidden_state()
    if mode == 'test':
        with torch.no_grad():
            output = model(images)
    else:
        output = model(images)
    loss = criterion(output, labels)
    predicted_labels = output.detach().argmax(dim=1)
    acc = (predicted_labels == labels).cpu().numpy().sum()
    return loss, acc, predicted_labels.cpu()


def train_model(model, dataloader, device, optimizer, criterion):
    train_loss, train_acc = 0.0, 0.0
    model.train()
    for local_images, local_labels in dataloader:
        local_images, local_labels = local_images.to(device), local_labels.to(device)
        optimizer.zero_grad()  # zero the parameter gradients
        loss, acc, ___ = foward_step(model, local_images, local_labels, criterion, mode='train')
        train_loss += loss.item()
        train_acc += acc
        loss.backward()  # compute the gradients
        optimizer.step()  # update the parameters with the gradients
    train_acc = 100 * (train_acc / len(dataloader.dataset))
    train_loss = train_loss / len(dataloader)
    return train_loss, train_acc


def main():
    device = torch.device("cpu")
    num_class = 10
    clips = torch.randn(96, 5, 3, 32, 32)
    labels = torch.randint(0, num_class, (96,))
    train_loader = DataLoader(TensorDataset(clips, labels), batch_size=16, shuffle=True)
    model = ConvLstm(64, 32, 2, True, num_class).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-4)
    criterion = nn.CrossEntropyLoss()
    for epoch in range(3):
        train_loss, train_acc = train_model(model, train_loader, device, optimizer, criterion)
        print(f'Epoch {epoch} : Train loss {train_loss:.8f}, Train acc {train_acc:.3f}')


if __name__ == '__main__':
    main()
