# Source: https://github.com/HuiZeng/Grid-Anchor-based-Image-Cropping-Pytorch/issues/2
# Original: HuiZeng/Grid-Anchor-based-Image-Cropping-Pytorch TrainModel.py (train, test) and croppingModel.py
# (fc_layers, crop_model_single_scale), read at 6fcf2b0 (the version before 80c0a99)
# Bug: test() puts the net in eval mode and train() calls net.train() only once, before the epoch loop; after the
# first epoch's evaluation every later epoch trains with BatchNorm frozen and the head's Dropout(p=0.5) off. The
# author confirmed the bug ("I have checked code and found this is indeed a bug") and later chose eval mode on
# purpose (80c0a99). Ours: a small conv backbone instead of MobileNetV2, box pooling by slicing instead of the
# RoIAlign/RoDAlign CUDA extensions, random images, boxes and MOS scores, 3 epochs; train()/test() keep their shape.
import random

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim

SEED = 0
torch.manual_seed(SEED)
random.seed(SEED)


def fc_layers(reddim=32, alignsize=8):
    conv1 = nn.Sequential(nn.Conv2d(reddim, 64, kernel_size=alignsize, padding=0), nn.BatchNorm2d(64), nn.ReLU(inplace=True))
    conv2 = nn.Sequential(nn.Conv2d(64, 32, kernel_size=1), nn.BatchNorm2d(32), nn.ReLU(inplace=True))
    dropout = nn.Dropout(p=0.5)
    conv3 = nn.Conv2d(32, 1, kernel_size=1)
    layers = nn.Sequential(conv1, conv2, dropout, conv3)
    return layers


class crop_model_single_scale(nn.Module):
    def __init__(self, alignsize=4, reddim=8, downsample=2):
        super().__init__()
        self.Feat_ext = nn.Sequential(nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                                      nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32), nn.ReLU())
        self.DimRed = nn.Conv2d(32, reddim, kernel_size=1, padding=0)
        self.alignsize = alignsize
        self.scale = 1.0 / 2 ** downsample
        self.FC_layers = fc_layers(reddim * 2, alignsize)

    def align(self, feat, boxes):
        # stand-in for RoIAlignAvg / RoDAlignAvg: pool the box, and the whole map as its context
        out_roi, out_rod = [], []
        for _, x0, y0, x1, y1 in boxes.tolist():
            x0, y0 = int(x0 * self.scale), int(y0 * self.scale)
            x1, y1 = max(int(x1 * self.scale), x0 + 1), max(int(y1 * self.scale), y0 + 1)
            out_roi.append(F.adaptive_avg_pool2d(feat[:, :, y0:y1, x0:x1], self.alignsize))
            out_rod.append(F.adaptive_avg_pool2d(feat, self.alignsize))
        return torch.cat(out_roi), torch.cat(out_rod)

    def forward(self, im_data, boxes):
        base_feat = self.Feat_ext(im_data)
        red_feat = self.DimRed(base_feat)
        RoI_feat, RoD_feat = self.align(red_feat, boxes)
        final_feat = torch.cat((RoI_feat, RoD_feat), 1)
        prediction = self.FC_layers(final_feat)
        return prediction


def make_sample():
    bboxs = {k: [] for k in ('xmin', 'ymin', 'xmax', 'ymax')}
    for _ in range(24):
        x0, y0 = random.randint(0, 32), random.randint(0, 32)
        bboxs['xmin'].append(x0)
        bboxs['ymin'].append(y0)
        bboxs['xmax'].append(x0 + random.randint(16, 32))
        bboxs['ymax'].append(y0 + random.randint(16, 32))
    return {'image': torch.rand(1, 3, 64, 64), 'bbox': bboxs, 'MOS': torch.rand(24) * 5}


data_loader_train = [make_sample() for _ in range(12)]
data_loader_test = [make_sample() for _ in range(4)]

net = crop_model_single_scale()
optimizer = optim.Adam(net.parameters(), lr=1e-4)


def test():
    net.eval()
    total_loss = 0
    avg_loss = 0
    for id, sample in enumerate(data_loader_test):
        image = sample['image']
        bboxs = sample['bbox']
        MOS = sample['MOS']
        roi = []
        for idx in range(0, len(bboxs['xmin'])):
            roi.append((0, bboxs['xmin'][idx], bboxs['ymin'][idx], bboxs['xmax'][idx], bboxs['ymax'][idx]))
        roi = torch.Tensor(roi)
        out = net(image, roi)
        loss = torch.nn.SmoothL1Loss(reduction='mean')(out.squeeze(), torch.Tensor(MOS))
        total_loss += loss.item()
        avg_loss = total_loss / (id + 1)
    return avg_loss


def train():
    net.train()
    for epoch in range(0, 3):
        total_loss = 0
        for id, sample in enumerate(data_loader_train):
            image = sample['image']
            bboxs = sample['bbox']
            roi = []
            MOS = []
            random_ID = list(range(0, len(bboxs['xmin'])))
            random.shuffle(random_ID)
            for idx in random_ID[:64]:
                roi.append((0, bboxs['xmin'][idx], bboxs['ymin'][idx], bboxs['xmax'][idx], bboxs['ymax'][idx]))
                MOS.append(sample['MOS'][idx])
            roi = torch.Tensor(roi)
            MOS = torch.Tensor(MOS)

            # forward
            out = net(image, roi)
            loss = torch.nn.SmoothL1Loss(reduction='mean')(out.squeeze(), MOS)
            total_loss += loss.item()
            avg_loss = total_loss / (id + 1)

            # backprop
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

        test_avg_loss = test()  # BUG
        print(f'[Epoch {epoch}/2] [Train Loss: {avg_loss:.4f}] [Test Loss: {test_avg_loss:.4f}]')


if __name__ == '__main__':
    train()
