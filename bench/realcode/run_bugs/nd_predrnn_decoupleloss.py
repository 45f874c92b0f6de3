# Source: https://github.com/thuml/predrnn-pytorch/issues/11
# Original: thuml/predrnn-pytorch core/models/predrnn_memory_decoupling.py (RNN.forward), core/trainer.py
# Bug: the memory-decoupling loss collects one cosine term per layer and step in a list and averages them through
# torch.tensor(list): a new constant with no graph. The loss value is right but its gradient is gone, so the
# shared adapter (used only by that loss) never trains and the decoupling regulariser does nothing.
import torch
import torch.nn.functional as F

torch.manual_seed(0)


class STCell(torch.nn.Module):
    def __init__(self, in_ch, hid):
        super().__init__()
        self.conv_x = torch.nn.Conv2d(in_ch, 4 * hid, 3, padding=1)
        self.conv_h = torch.nn.Conv2d(hid, 4 * hid, 3, padding=1)
        self.conv_m = torch.nn.Conv2d(hid, 3 * hid, 3, padding=1)

    def forward(self, x, h, c, m):
        i, f, g, o = torch.split(self.conv_x(x) + self.conv_h(h), h.shape[1], dim=1)
        delta_c = torch.sigmoid(i) * torch.tanh(g)
        c_new = torch.sigmoid(f) * c + delta_c
        i_m, f_m, g_m = torch.split(self.conv_m(m), h.shape[1], dim=1)
        delta_m = torch.sigmoid(i_m) * torch.tanh(g_m)
        m_new = torch.sigmoid(f_m) * m + delta_m
        h_new = torch.sigmoid(o) * torch.tanh(c_new + m_new)
        return h_new, c_new, m_new, delta_c, delta_m


class PredRNN(torch.nn.Module):
    def __init__(self, hid=8, layers=2, decouple_beta=0.1):
        super().__init__()
        self.hid, self.decouple_beta = hid, decouple_beta
        self.cells = torch.nn.ModuleList([STCell(1 if i == 0 else hid, hid) for i in range(layers)])
        self.conv_last = torch.nn.Conv2d(hid, 1, 1, bias=False)
        self.adapter = torch.nn.Conv2d(hid, hid, 1, bias=False)

    def forward(self, frames):
        b, t, _, hgt, wid = frames.shape
        h = [torch.zeros(b, self.hid, hgt, wid) for _ in self.cells]
        c = [torch.zeros(b, self.hid, hgt, wid) for _ in self.cells]
        memory = torch.zeros(b, self.hid, hgt, wid)
        next_frames, decouple_loss = [], []
        for step in range(t - 1):
            net = frames[:, step]
            for i, cell in enumerate(self.cells):
                h[i], c[i], memory, delta_c, delta_m = cell(net if i == 0 else h[i - 1], h[i], c[i], memory)
                dc = F.normalize(self.adapter(delta_c).flatten(2), dim=2)
                dm = F.normalize(self.adapter(delta_m).flatten(2), dim=2)
                decouple_loss.append(torch.mean(torch.abs(torch.cosine_similarity(dc, dm, dim=2))))
            next_frames.append(self.conv_last(h[-1]))
        decouple_loss = torch.mean(torch.tensor(decouple_loss))  # BUG
        next_frames = torch.stack(next_frames, dim=1)
        loss = F.mse_loss(next_frames, frames[:, 1:]) + self.decouple_beta * decouple_loss
        return next_frames, loss


def train(model, optimizer, frames):
    model.train()
    optimizer.zero_grad()
    _, loss = model(frames)
    loss.backward()
    optimizer.step()
    return loss.item()


model = PredRNN()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
for itr in range(20):
    frames = torch.rand(2, 6, 1, 8, 8)
    cost = train(model, optimizer, frames)
    if itr % 5 == 0:
        print("itr", itr, "training loss", cost)
