# Source: https://github.com/modelscope/DiffSynth-Studio/pull/1404 (the same shape: huggingface/accelerate#1299)
# Original: modelscope/DiffSynth-Studio diffsynth/diffusion/runner.py (launch_training_task)
# Bug: optimizer.zero_grad() opens the accelerator.accumulate() block; Accelerate skips it on the micro-steps
# that do not sync, but on the step that syncs it runs before the backward and clears the gradients of the
# earlier micro-batches, so each update uses only the last micro-batch.
import torch
from accelerate import Accelerator

torch.manual_seed(0)


class DiffusionTrainingModule(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.dit = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32))

    def forward(self, data):
        noise = torch.randn_like(data)
        return torch.nn.functional.mse_loss(self.dit(data + noise), noise)


def launch_training_task(dataset, model, optimizer, scheduler, gradient_accumulation_steps, num_epochs):
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=gradient_accumulation_steps)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    for epoch_id in range(num_epochs):
        for data in dataset:
            with accelerator.accumulate(model):
                optimizer.zero_grad()  # BUG
                loss = model(data)
                accelerator.backward(loss)
                optimizer.step()
                scheduler.step()


model = DiffusionTrainingModule()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
scheduler = torch.optim.lr_scheduler.ConstantLR(optimizer, factor=1.0)
dataset = [torch.randn(4, 32) for _ in range(48)]
launch_training_task(dataset, model, optimizer, scheduler, gradient_accumulation_steps=4, num_epochs=2)
print("done")
