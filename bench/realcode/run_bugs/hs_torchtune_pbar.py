# Source: https://github.com/pytorch/torchtune/pull/522
# Original: pytorch/torchtune recipes/lora_finetune_single_device.py (LoRAFinetuneRecipeSingleDevice.train)
# Bug: the progress bar is updated with loss.item() on every step (a cudaStreamSynchronize per step);
# the fix moves it inside the log_every_n_steps block.
import torch
import torch.nn.functional as F

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
vocab, dim = 64, 32
model = torch.nn.Sequential(torch.nn.Embedding(vocab, dim), torch.nn.Linear(dim, dim), torch.nn.GELU(),
                            torch.nn.Linear(dim, vocab)).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
log_every_n_steps = 10
total_training_steps = 0
for curr_epoch in range(2):
    for idx in range(30):
        tokens = torch.randint(0, vocab, (4, 16), device=device)
        labels = torch.roll(tokens, -1, 1)
        logits = model(tokens)
        loss = F.cross_entropy(logits.reshape(-1, vocab), labels.reshape(-1))
        desc = f"{curr_epoch + 1}|{total_training_steps + 1}|Loss: {loss.item()}"  # BUG
        if total_training_steps % log_every_n_steps == 0:
            print(desc)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        total_training_steps += 1
