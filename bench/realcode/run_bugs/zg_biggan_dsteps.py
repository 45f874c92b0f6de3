# Source: https://github.com/ajbrock/BigGAN-PyTorch/issues/25 (fixed in ajbrock/BigGAN-PyTorch@b70f16c)
# Original: ajbrock/BigGAN-PyTorch train_fns.py (GAN_training_function) and train.py (the epoch loop)
# Bug: the training closure zeroes D's gradients once per call, but takes num_D_steps optimizer steps on D;
# from the second D step on, each backward adds to the gradient the previous step already applied.
import torch
import torch.nn.functional as F

torch.manual_seed(0)
config = {"batch_size": 16, "num_D_steps": 2, "num_D_accumulations": 1, "num_G_accumulations": 1,
          "dim_z": 16, "n_classes": 4, "toggle_grads": True}


class Generator(torch.nn.Module):
    def __init__(self, dim_z, n_classes):
        super().__init__()
        self.shared = torch.nn.Embedding(n_classes, 8)
        self.net = torch.nn.Sequential(torch.nn.Linear(dim_z + 8, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32),
                                       torch.nn.Tanh())
        self.optim = torch.optim.Adam(self.parameters(), lr=1e-4, betas=(0.0, 0.999))

    def forward(self, z, y):
        return self.net(torch.cat([z, self.shared(y)], 1))


class Discriminator(torch.nn.Module):
    def __init__(self, n_classes):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.LeakyReLU(0.2))
        self.linear = torch.nn.Linear(64, 1)
        self.embed = torch.nn.Embedding(n_classes, 64)
        self.optim = torch.optim.Adam(self.parameters(), lr=4e-4, betas=(0.0, 0.999))

    def forward(self, x, y):
        h = self.net(x)
        return self.linear(h) + (self.embed(y) * h).sum(1, keepdim=True)


class G_D(torch.nn.Module):
    def __init__(self, G, D):
        super().__init__()
        self.G, self.D = G, D

    def forward(self, z, gy, x=None, dy=None, train_G=False):
        with torch.set_grad_enabled(train_G):
            G_z = self.G(z, gy)
        if x is None:
            return self.D(G_z, gy)
        D_out = self.D(torch.cat([G_z, x], 0), torch.cat([gy, dy], 0))
        return torch.split(D_out, [G_z.shape[0], x.shape[0]])


def discriminator_loss(dis_fake, dis_real):
    return torch.mean(F.relu(1.0 - dis_real)), torch.mean(F.relu(1.0 + dis_fake))


def generator_loss(dis_fake):
    return -torch.mean(dis_fake)


def toggle_grad(model, on_or_off):
    for param in model.parameters():
        param.requires_grad = on_or_off


def GAN_training_function(G, D, GD, config):
    def sample(n):
        return torch.randn(n, config["dim_z"]), torch.randint(0, config["n_classes"], (n,))

    def train(x, y):
        G.optim.zero_grad()
        D.optim.zero_grad()
        x = torch.split(x, config["batch_size"])
        y = torch.split(y, config["batch_size"])
        counter = 0
        if config["toggle_grads"]:
            toggle_grad(D, True)
            toggle_grad(G, False)
        for step_index in range(config["num_D_steps"]):
            for accumulation_index in range(config["num_D_accumulations"]):
                z_, y_ = sample(config["batch_size"])
                D_fake, D_real = GD(z_, y_, x[counter], y[counter], train_G=False)
                D_loss_real, D_loss_fake = discriminator_loss(D_fake, D_real)
                D_loss = (D_loss_real + D_loss_fake) / float(config["num_D_accumulations"])
                D_loss.backward()  # BUG
                counter += 1
            D.optim.step()
        if config["toggle_grads"]:
            toggle_grad(D, False)
            toggle_grad(G, True)
        G.optim.zero_grad()
        for accumulation_index in range(config["num_G_accumulations"]):
            z_, y_ = sample(config["batch_size"])
            G_loss = generator_loss(GD(z_, y_, train_G=True)) / float(config["num_G_accumulations"])
            G_loss.backward()
        G.optim.step()
        return {"G_loss": float(G_loss.item()), "D_loss_real": float(D_loss_real.item()),
                "D_loss_fake": float(D_loss_fake.item())}

    return train


G = Generator(config["dim_z"], config["n_classes"])
D = Discriminator(config["n_classes"])
GD = G_D(G, D)
train = GAN_training_function(G, D, GD, config)
D_batch_size = config["batch_size"] * config["num_D_steps"] * config["num_D_accumulations"]
centers = torch.randn(config["n_classes"], 32)
for epoch in range(3):
    for i in range(40):
        y = torch.randint(0, config["n_classes"], (D_batch_size,))
        x = torch.tanh(centers[y] + 0.3 * torch.randn(D_batch_size, 32))
        G.train()
        D.train()
        metrics = train(x, y)
    print("epoch", epoch, metrics)
