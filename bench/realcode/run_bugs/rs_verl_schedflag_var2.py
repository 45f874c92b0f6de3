# Source: https://github.com/verl-project/verl/issues/7953 (variant of rs_verl_schedflag_b: a restore that skips the
#   optimizer's state behind a condition, here in a package's checkpoint module; the code is ours)
# Bug: rs_verl_schedflag_var2_pkg/ckpt.py read() loads the optimizer's state only when it is handed an optimizer; the
# script calls it with the model alone, before it builds the optimizer, so every continued run (the same script wrote
# that checkpoint, optimizer and all) restarts SGD's momentum from zero. The `# BUG` line is in ckpt.py.
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rs_verl_schedflag_var2_pkg import ckpt, engine  # noqa: E402

root = sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp()
path = os.path.join(root, "run", "latest.pt")


def data(seed, n=8):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(16, 12, generator=g), torch.randint(0, 4, (16,), generator=g)) for _ in range(n)]


def net():
    return nn.Sequential(nn.Linear(12, 48), nn.ReLU(), nn.Linear(48, 4))


if len(sys.argv) > 1 and sys.argv[1] == "--first-job":
    torch.manual_seed(1)
    m = net()
    o = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    for ep in range(3):
        engine.train_one_epoch(m, data(ep), o)
        ckpt.write(path, m, o, (ep + 1) * 8)
    sys.exit(0)

subprocess.run([sys.executable, __file__, "--first-job", root], check=True,
               env={k: v for k, v in os.environ.items() if not k.startswith("TORCHDOCTOR")})
torch.manual_seed(0)
m = net()
step = ckpt.read(path, m)
o = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
for ep in range(step // 8, 6):
    engine.train_one_epoch(m, data(10 + ep), o)
    ckpt.write(path, m, o, (ep + 1) * 8)
print(f"continued from step {step}: the checkpoint held momentum for "
      f"{len(torch.load(path)['optim']['state'])} tensors; the resumed optimizer started with none")
