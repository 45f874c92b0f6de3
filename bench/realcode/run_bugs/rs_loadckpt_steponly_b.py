# Source: synthetic: state 3 of run14 (a checkpoint folder an earlier run wrote, its optimizer file never read)
# Original: our own; a Hugging Face-like checkpoint-<step>/ folder (model.pt, optimizer.pt, trainer_state.pt)
# Bug: load_checkpoint() reads the weights and the step from the folder and never opens optimizer.pt beside them:
# the continued run's AdamW starts with empty moments although the earlier run saved them.
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F

ROOT = sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp()


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(50, 16), torch.nn.Flatten(), torch.nn.Linear(16 * 4, 50))


def save_checkpoint(model, optimizer, step):
    folder = os.path.join(ROOT, f"checkpoint-{step}")
    os.makedirs(folder, exist_ok=True)
    torch.save(model.state_dict(), os.path.join(folder, "model.pt"))
    torch.save(optimizer.state_dict(), os.path.join(folder, "optimizer.pt"))
    torch.save({"global_step": step}, os.path.join(folder, "trainer_state.pt"))


def load_checkpoint(model, folder):
    model.load_state_dict(torch.load(os.path.join(folder, "model.pt")))  # BUG
    return torch.load(os.path.join(folder, "trainer_state.pt"))["global_step"]


def train(max_steps, resume_from=None):
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3)
    step = load_checkpoint(model, resume_from) if resume_from else 0
    g = torch.Generator().manual_seed(step)
    while step < max_steps:
        tokens = torch.randint(0, 50, (16, 5), generator=g)
        loss = F.cross_entropy(model(tokens[:, :4]), tokens[:, 4])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        if step % 20 == 0 and len(sys.argv) > 1:
            save_checkpoint(model, optimizer, step)
    print(f"step {step} loss {loss.item():.3f}")


if len(sys.argv) > 1 and sys.argv[1] == "--earlier":
    train(40)
else:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHDOCTOR")}
    subprocess.run([sys.executable, __file__, "--earlier", ROOT], check=True, env=env)
    train(80, resume_from=os.path.join(ROOT, "checkpoint-40"))
