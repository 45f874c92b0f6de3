"""CheXNet trainer whose validation sums the per-batch loss tensors, graphs attached, over the whole val set.

Source: https://github.com/zoogzog/chexnet/issues/12 ("Memory error while training": out of memory at
the end of the first epoch; a commenter points at `losstensorMean += losstensor`)
Original: zoogzog/chexnet ChexnetTrainer.py (ChexnetTrainer.train / epochTrain / epochVal), read at
34d29ee.
Bug: epochVal wraps its inputs in Variable(..., volatile=True), which stopped having any effect in
PyTorch 0.4, so every validation forward builds a graph; `losstensorMean += losstensor` then keeps each
batch's graph reachable until the mean is handed to the scheduler after the loop. The issue is open;
the commenters' fix is to sum the values, not the tensors.
Ours: a small conv net with a sigmoid head instead of DenseNet-121 (14 labels kept), random images and
multi-hot targets, CPU, no DataParallel; `.data[0]` on 0-d tensors (an error since 0.4) became `.item()`.
"""
import time

import torch
import torch.nn as nn
import torch.optim as optim
from torch.optim.lr_scheduler import ReduceLROnPlateau
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)


class DenseNet121(nn.Module):
    def __init__(self, classCount, isTrained):
        super().__init__()
        self.densenet121 = nn.Sequential(
            nn.Conv2d(3, 16, 3, 2, 1), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 32, 3, 2, 1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(),
            nn.Linear(32, classCount), nn.Sigmoid())

    def forward(self, x):
        return self.densenet121(x)


class ChexnetTrainer:

    def train(nnClassCount, trBatchSize, trMaxEpoch):
        model = DenseNet121(nnClassCount, False)
        datasetTrain = TensorDataset(torch.randn(192, 3, 32, 32), (torch.rand(192, nnClassCount) < 0.1).float())
        datasetVal = TensorDataset(torch.randn(320, 3, 32, 32), (torch.rand(320, nnClassCount) < 0.1).float())
        dataLoaderTrain = DataLoader(dataset=datasetTrain, batch_size=trBatchSize, shuffle=True)
        dataLoaderVal = DataLoader(dataset=datasetVal, batch_size=trBatchSize, shuffle=False)

        optimizer = optim.Adam(model.parameters(), lr=0.0001, betas=(0.9, 0.999), eps=1e-08, weight_decay=1e-5)
        scheduler = ReduceLROnPlateau(optimizer, factor=0.1, patience=5, mode="min")
        loss = torch.nn.BCELoss(reduction="mean")

        lossMIN = 100000
        for epochID in range(0, trMaxEpoch):
            ChexnetTrainer.epochTrain(model, dataLoaderTrain, optimizer, scheduler, trMaxEpoch, nnClassCount, loss)
            lossVal, losstensor = ChexnetTrainer.epochVal(model, dataLoaderVal, optimizer, scheduler, trMaxEpoch, nnClassCount, loss)
            timestampEND = time.strftime("%d%m%Y") + "-" + time.strftime("%H%M%S")
            scheduler.step(losstensor.item())
            if lossVal < lossMIN:
                lossMIN = lossVal
                print("Epoch [" + str(epochID + 1) + "] [save] [" + timestampEND + "] loss= " + str(lossVal))
            else:
                print("Epoch [" + str(epochID + 1) + "] [----] [" + timestampEND + "] loss= " + str(lossVal))

    def epochTrain(model, dataLoader, optimizer, scheduler, epochMax, classCount, loss):
        model.train()
        for batchID, (input, target) in enumerate(dataLoader):
            varInput = torch.autograd.Variable(input)
            varTarget = torch.autograd.Variable(target)
            varOutput = model(varInput)
            lossvalue = loss(varOutput, varTarget)
            optimizer.zero_grad()
            lossvalue.backward()
            optimizer.step()

    def epochVal(model, dataLoader, optimizer, scheduler, epochMax, classCount, loss):
        model.eval()
        lossVal = 0
        lossValNorm = 0
        losstensorMean = 0
        for i, (input, target) in enumerate(dataLoader):
            varInput = torch.autograd.Variable(input, volatile=True)
            varTarget = torch.autograd.Variable(target, volatile=True)
            varOutput = model(varInput)

            losstensor = loss(varOutput, varTarget)
            losstensorMean += losstensor  # BUG

            lossVal += losstensor.item()
            lossValNorm += 1

        outLoss = lossVal / lossValNorm
        losstensorMean = losstensorMean / lossValNorm
        return outLoss, losstensorMean


ChexnetTrainer.train(nnClassCount=14, trBatchSize=16, trMaxEpoch=3)
