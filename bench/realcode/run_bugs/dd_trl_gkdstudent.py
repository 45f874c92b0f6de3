# Source: https://github.com/huggingface/trl/issues/5282 (a maintainer confirmed the concern is real)
# Original: huggingface/trl trl/trainer/gkd_trainer.py (GKDTrainer.compute_loss with use_liger_gkd_loss=True); from
# the issue text
# Bug: with the fused (liger) GKD loss the trainer unwraps the student, takes its decoder and runs it directly, then
# applies the LM head's weight inside the fused loss: DistributedDataParallel.forward never runs, its reducer is
# never armed, and no gradient is all-reduced, so each rank trains its own student. Run with torchrun, 2 processes
# (gloo); tiny student/teacher LMs and our own stand-in for the fused JSD loss.
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from accelerate import Accelerator

torch.manual_seed(0)


class TinyLM(torch.nn.Module):
    base_model_prefix = "model"

    def __init__(self, vocab=48, dim=32):
        super().__init__()
        self.model = torch.nn.Sequential(torch.nn.Embedding(vocab, dim), torch.nn.Linear(dim, dim), torch.nn.GELU())
        self.lm_head = torch.nn.Linear(dim, vocab, bias=False)

    def get_decoder(self):
        return None

    def forward(self, input_ids, attention_mask=None, use_cache=False):
        return SimpleNamespace(logits=self.lm_head(self.model(input_ids)))


def fused_linear_jsd(student_input, student_weight, teacher_input, teacher_weight, beta=0.5, temperature=1.0):
    # stand-in for LigerFusedLinearJSDLoss: the head projection and the generalised JSD in one call
    s_logp = F.log_softmax(student_input @ student_weight.t() / temperature, dim=-1)
    t_logp = F.log_softmax(teacher_input @ teacher_weight.t() / temperature, dim=-1)
    mix = torch.logsumexp(torch.stack([s_logp + torch.log(torch.tensor(1 - beta)),
                                       t_logp + torch.log(torch.tensor(beta))]), dim=0)
    kl_t = F.kl_div(mix, t_logp, reduction="batchmean", log_target=True)
    kl_s = F.kl_div(mix, s_logp, reduction="batchmean", log_target=True)
    return beta * kl_t + (1 - beta) * kl_s


class GKDTrainer:
    def __init__(self, model, teacher_model, args, train_dataset):
        self.args = args
        self.accelerator = Accelerator(cpu=True)
        self.use_liger_gkd_loss = args.use_liger_kernel
        self.teacher_model = teacher_model.eval().requires_grad_(False)
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate)
        loader = torch.utils.data.DataLoader(train_dataset, batch_size=args.per_device_train_batch_size, shuffle=True)
        self.model, self.optimizer, self.train_dataloader = self.accelerator.prepare(model, optimizer, loader)

    def compute_loss(self, model, inputs, return_outputs=False):
        input_ids, attention_mask = inputs
        if self.use_liger_gkd_loss:
            unwrapped_student = self.accelerator.unwrap_model(model)
            if hasattr(unwrapped_student, "get_decoder") and unwrapped_student.get_decoder() is not None:
                base_student = unwrapped_student.get_decoder()
            else:
                base_student = getattr(unwrapped_student, getattr(unwrapped_student, "base_model_prefix", "model"),
                                       unwrapped_student)
            student_hidden = base_student(input_ids)  # BUG
            with torch.no_grad():
                teacher_hidden = self.teacher_model.model(input_ids)
            mask = attention_mask.bool()
            return fused_linear_jsd(student_hidden[mask], unwrapped_student.lm_head.weight,
                                    teacher_hidden[mask], self.teacher_model.lm_head.weight, beta=self.args.beta)
        outputs = model(input_ids, attention_mask=attention_mask)
        with torch.no_grad():
            teacher_logits = self.teacher_model(input_ids).logits
        return F.kl_div(F.log_softmax(outputs.logits, -1), F.log_softmax(teacher_logits, -1), log_target=True,
                        reduction="batchmean")

    def train(self):
        self.model.train()
        for epoch in range(self.args.num_train_epochs):
            for step, inputs in enumerate(self.train_dataloader):
                loss = self.compute_loss(self.model, inputs)
                self.accelerator.backward(loss)
                self.optimizer.step()
                self.optimizer.zero_grad()
                if step % 10 == 0 and self.accelerator.is_main_process:
                    print(f"epoch {epoch} step {step} loss {loss.item():.4f}")


def make_dataset(n=256, seq=12, vocab=48):
    input_ids = torch.randint(0, vocab, (n, seq))
    lengths = torch.randint(6, seq + 1, (n,))
    attention_mask = (torch.arange(seq)[None, :] < lengths[:, None]).long()
    return torch.utils.data.TensorDataset(input_ids, attention_mask)


args = SimpleNamespace(learning_rate=5e-3, per_device_train_batch_size=8, num_train_epochs=2, beta=0.5,
                       use_liger_kernel=True)
teacher = TinyLM()
trainer = GKDTrainer(TinyLM(), teacher, args, make_dataset())
trainer.train()
