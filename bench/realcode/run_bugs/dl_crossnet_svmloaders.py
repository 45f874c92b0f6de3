# Source: https://github.com/liujia99/CrossNet/issues/2
# Original: liujia99/CrossNet train_crossnet_con.py (lines 171-172, the SVM evaluation loaders)
# Bug: the ModelNet40SVM train/test DataLoaders (with worker processes) are built inside the epoch loop, so
# every epoch starts their workers again; they belong before the loop.
import torch
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
train_set = TensorDataset(torch.randn(96, 32))
svm_train = TensorDataset(torch.randn(40, 32), torch.randint(0, 4, (40,)))
svm_test = TensorDataset(torch.randn(20, 32), torch.randint(0, 4, (20,)))
encoder = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 16))
opt = torch.optim.Adam(encoder.parameters(), lr=1e-3)
train_loader = DataLoader(train_set, batch_size=16, shuffle=True)

for epoch in range(4):
    for (x,) in train_loader:
        a, b = encoder(x + 0.1 * torch.randn_like(x)), encoder(x + 0.1 * torch.randn_like(x))
        loss = -torch.nn.functional.cosine_similarity(a, b).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    train_val_loader = DataLoader(svm_train, batch_size=20, shuffle=True, num_workers=1)  # BUG
    test_val_loader = DataLoader(svm_test, batch_size=20, shuffle=True, num_workers=1)
    with torch.no_grad():
        feats = [(encoder(x), y) for x, y in train_val_loader]
        test_feats = [(encoder(x), y) for x, y in test_val_loader]
    print("epoch", epoch, len(feats), len(test_feats))
