# Source: https://github.com/lucidrains/DALLE-pytorch/commit/07972d6ce438c1953d40f47c73d9a34b4d690fa0
# Original: lucidrains/DALLE-pytorch train_dalle.py (save_model)
# Bug: the checkpoint saved every N steps holds the weights and hparams only: the optimizer state and the
# epoch are neither saved nor restored, so --resume restarts Adam and epoch 0.
import os
import tempfile

import torch
import torch.nn.functional as F

torch.manual_seed(0)
SAVE_EVERY_N_STEPS = 10
dalle_params = dict(num_text_tokens=50, dim=32)
dalle = torch.nn.Sequential(torch.nn.Embedding(50, 32), torch.nn.Linear(32, 50))
opt = torch.optim.Adam(dalle.parameters(), lr=3e-4)
scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="min", factor=0.5, patience=10)
out_dir = tempfile.mkdtemp()
DALLE_OUTPUT_FILE_NAME = os.path.join(out_dir, "dalle.pt")
DALLE_PATH = None  # --dalle_path: the original resumes from a checkpoint of its own when given one
RESUME = DALLE_PATH is not None and os.path.exists(DALLE_PATH)
if RESUME:
    loaded_obj = torch.load(DALLE_PATH, weights_only=True)
    dalle.load_state_dict(loaded_obj["weights"])  # the optimizer and the epoch are not restored


def save_model(path):
    save_obj = {
        "hparams": dalle_params,
        "weights": dalle.state_dict(),
    }
    torch.save(save_obj, path)  # BUG


for epoch in range(2):
    for i in range(20):
        text = torch.randint(0, 50, (4, 12))
        logits = dalle(text[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, 50), text[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(dalle.parameters(), 0.5)
        opt.step()
        opt.zero_grad()
        if i % SAVE_EVERY_N_STEPS == 0:
            save_model(DALLE_OUTPUT_FILE_NAME)
    scheduler.step(loss.item())
print("done")
