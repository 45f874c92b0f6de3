"""Source: https://github.com/naoto0804/pytorch-AdaIN/commit/1c5172e8551cb02056949594f89950be2592daae
("avoid zero-division"). Read: function.py (adaptive_instance_normalization), net.py (Net: the encoder split at
relu1_1..relu4_1, forward with its content and style losses) and train.py (the step loop) at the fix's parent
(1c5172e^).

Bug: adaptive_instance_normalization divides the centred content features by their per-channel spatial std. A
relu4_1 channel that is zero everywhere for one content image (a dead ReLU channel, common at that depth) has std
0, so that channel of the AdaIN target becomes 0/0 = NaN; the decoder's input, output and loss are NaN and, after
the step, so are the decoder's weights. The fix computes the std as sqrt(var + 1e-5).

Theirs: adaptive_instance_normalization as at the parent; Net's structure (frozen encoder cut into four stages,
`t = adain(encode(content), style_feats[-1])`, the decoder fed `t.data`, content loss on relu4_1 and style loss
on mean/std of the four stages); the train loop (adjust_learning_rate, Adam on decoder parameters only,
content_weight 1.0, style_weight 1e-2 here 10). Ours: a small randomly initialised VGG-like encoder instead of
vgg_normalised.pth (frozen as theirs), a small decoder with the same reflection-pad/conv/upsample shape, random
64x64 images instead of COCO/WikiArt folders, no saving.
"""
import torch
import torch.nn as nn

torch.manual_seed(0)


def adaptive_instance_normalization(content_feat, style_feat):
    size = content_feat.data.size()
    N, C = size[:2]
    assert (size[:2] == style_feat.data.size()[:2])

    style_std = style_feat.view(N, C, -1).std(dim=2).view(N, C, 1, 1)
    style_mean = style_feat.view(N, C, -1).mean(dim=2).view(N, C, 1, 1)
    content_std = content_feat.view(N, C, -1).std(dim=2).view(N, C, 1, 1)  # BUG
    content_mean = content_feat.view(N, C, -1).mean(dim=2).view(N, C, 1, 1)
    normalized_feat = (content_feat - content_mean.expand(
        size)) / content_std.expand(size)
    return normalized_feat * style_std.expand(size) + style_mean.expand(size)


adain = adaptive_instance_normalization


def block(cin, cout):
    return [nn.ReflectionPad2d(1), nn.Conv2d(cin, cout, 3), nn.ReLU()]


vgg = nn.Sequential(
    nn.Conv2d(3, 3, 1), *block(3, 16),                                  # relu1_1
    *block(16, 16), nn.MaxPool2d(2), *block(16, 32),                    # relu2_1
    *block(32, 32), nn.MaxPool2d(2), *block(32, 64),                    # relu3_1
    *block(64, 64), nn.MaxPool2d(2), *block(64, 128),                   # relu4_1
)
decoder = nn.Sequential(
    *block(128, 64), nn.Upsample(scale_factor=2, mode='nearest'),
    *block(64, 32), nn.Upsample(scale_factor=2, mode='nearest'),
    *block(32, 16), nn.Upsample(scale_factor=2, mode='nearest'),
    nn.ReflectionPad2d(1), nn.Conv2d(16, 3, 3),
)


class Net(nn.Module):
    def __init__(self, encoder, decoder):
        super().__init__()
        enc_layers = list(encoder.children())
        self.enc_1 = nn.Sequential(*enc_layers[:4])  # get relu1_1
        self.enc_2 = nn.Sequential(*enc_layers[4:11])  # get relu2_1
        self.enc_3 = nn.Sequential(*enc_layers[11:18])  # get relu3_1
        self.enc_4 = nn.Sequential(*enc_layers[18:25])  # get relu4_1
        self.decoder = decoder

    def encode_with_intermediate(self, input):
        results = []
        for i in range(4):
            func = getattr(self, f'enc_{i + 1:d}')
            if i == 0:
                results.append(func(input))
            else:
                results.append(func(results[-1]))
        return results

    def encode(self, input):
        for i in range(4):
            input = getattr(self, f'enc_{i + 1:d}')(input)
        return input

    def forward(self, content, style):
        def mse(a, b):
            assert (a.data.size() == b.data.size())
            return nn.MSELoss()(a - b, torch.zeros_like(a))

        def calc_style_loss(a, b):
            N, C = a.data.size()[:2]
            size = (N, C, -1)
            return mse(a.view(*size).mean(2), b.view(*size).mean(2)) + \
                mse(a.view(*size).std(2), b.view(*size).std(2))

        style_feats = self.encode_with_intermediate(style)
        t = adain(self.encode(content), style_feats[-1])

        g_t = self.decoder(t.data)
        g_t_feats = self.encode_with_intermediate(g_t)

        loss_c = mse(g_t_feats[-1], t)
        loss_s = calc_style_loss(g_t_feats[0], style_feats[0])
        for i in range(1, 4):
            loss_s += calc_style_loss(g_t_feats[i], style_feats[i])
        return loss_c, loss_s


lr, lr_decay, content_weight, style_weight = 1e-4, 5e-5, 1.0, 10.0


def adjust_learning_rate(optimizer, iteration_count):
    """Imitating the original implementation"""
    lr_now = lr / (1.0 + lr_decay * iteration_count)
    for param_group in optimizer.param_groups:
        param_group['lr'] = lr_now


for param in vgg.parameters():
    param.requires_grad = False
network = Net(vgg, decoder)
network.train()
optimizer = torch.optim.Adam(network.decoder.parameters(), lr=lr)
for i in range(10):
    adjust_learning_rate(optimizer, iteration_count=i)
    content_images = torch.rand(4, 3, 64, 64)
    style_images = torch.rand(4, 3, 64, 64)
    optimizer.zero_grad()
    loss_c, loss_s = network(content_images, style_images)
    loss = content_weight * loss_c + style_weight * loss_s
    loss.backward()
    optimizer.step()
    print(i, "loss_c", loss_c.item(), "loss_s", loss_s.item())
