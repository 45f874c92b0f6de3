"""Source: https://github.com/r9y9/deepvoice3_pytorch/commit/874824e9299406768af4820cc5ac45567686bebc
("model turns to eval-mode while calling `eval_model`... Need to get back to train-mode.")
Original: r9y9/deepvoice3_pytorch train.py (train, eval_model, spec_loss, logit) and synthesis.py (tts), read at
874824e^.
Bug: train() calls model.train() once before the epoch loop. Every eval_interval steps eval_model() synthesises
test sentences through synthesis.tts(), which calls model.eval() and never switches back, so every later training
step runs with dropout off. The fix moves model.train() inside the step loop.
Theirs: the train() loop shape (noam learning-rate schedule set by hand, zero_grad, seq2seq + postnet forward,
spec_loss with the binary divergence, BCE done loss, eval_model called after the forward and before backward,
clip_grad_norm, writer scalars), eval_model looping over texts through tts, tts's model.eval() and greedy decode
without no_grad (theirs: Variable code of PyTorch 0.3).
Ours: a tiny text-to-mel model with dropout 0.05 (their hparams) in place of DeepVoice3's conv blocks and
attention, random token/mel batches, r = 1, no guided attention, no checkpoints or images or wav files (the
writer keeps scalars in memory), eval_interval = 10, a character table for the frontend.
"""
from types import SimpleNamespace

import numpy as np
import torch
import torch.nn as nn

torch.manual_seed(0)

hparams = SimpleNamespace(dropout=1 - 0.95, outputs_per_step=1, downsample_step=1, masked_loss_weight=0.0,
                          priority_freq_weight=0.0, binary_divergence_weight=0.1, use_guided_attention=False,
                          lr_schedule="noam_learning_rate_decay", lr_schedule_kwargs={}, eval_interval=10,
                          checkpoint_interval=10000)
global_step = 0
global_epoch = 0


class MemoryWriter:
    def __init__(self):
        self.scalars = []

    def add_scalar(self, tag, value, step):
        self.scalars.append((tag, float(value), step))


class Frontend:
    def text_to_sequence(self, text, p=0):
        return [min(ord(c), 127) for c in text.lower()]


_frontend = Frontend()


def noam_learning_rate_decay(init_lr, global_step, warmup_steps=4000):
    warmup_steps = float(warmup_steps)
    step = global_step + 1.
    return init_lr * warmup_steps**0.5 * np.minimum(step * warmup_steps**-1.5, step**-0.5)


class TTSModel(nn.Module):
    def __init__(self, n_vocab=128, dim=32, mel_dim=16, linear_dim=24, dropout=hparams.dropout, max_frames=12):
        super().__init__()
        self.linear_dim, self.mel_dim, self.max_frames = linear_dim, mel_dim, max_frames
        self.embed = nn.Embedding(n_vocab, dim)
        self.encoder = nn.Sequential(nn.Dropout(dropout), nn.Conv1d(dim, dim, 3, padding=1), nn.ReLU())
        self.prenet = nn.Sequential(nn.Linear(mel_dim, dim), nn.ReLU(), nn.Dropout(dropout))
        self.attn = nn.MultiheadAttention(dim, 2, batch_first=True)
        self.mel_out = nn.Linear(dim, mel_dim)
        self.done_out = nn.Linear(dim, 1)
        self.postnet = nn.Sequential(nn.Dropout(dropout), nn.Linear(mel_dim, dim), nn.ReLU(), nn.Linear(dim, linear_dim))

    def seq2seq(self, x, mel):
        keys = self.encoder(self.embed(x).transpose(1, 2)).transpose(1, 2)
        query = self.prenet(mel)
        h, attn = self.attn(query, keys, keys)
        return torch.sigmoid(self.mel_out(h)), attn, torch.sigmoid(self.done_out(h)).squeeze(-1)

    def forward(self, x, mel=None, speaker_ids=None, text_positions=None, frame_positions=None, input_lengths=None):
        if mel is None:  # greedy decoding from a zero frame
            frames, attns, dones = [torch.zeros(x.size(0), 1, self.mel_dim)], [], []
            for _ in range(self.max_frames):
                out, attn, done = self.seq2seq(x, torch.cat(frames, dim=1))
                frames.append(out[:, -1:])
                attns.append(attn[:, -1:])
                dones.append(done[:, -1:])
            mel_outputs = torch.cat(frames[1:], dim=1)
            return mel_outputs, torch.sigmoid(self.postnet(mel_outputs)), torch.cat(attns, 1), torch.cat(dones, 1)
        mel_outputs, attn, done_hat = self.seq2seq(x, mel)
        linear_outputs = torch.sigmoid(self.postnet(mel_outputs))
        return mel_outputs, linear_outputs, attn, done_hat

    def get_trainable_parameters(self):
        return (p for p in self.parameters() if p.requires_grad)


def tts(model, text, p=0, speaker_id=None, fast=False):
    """Convert text to speech given a deepvoice3 model (theirs: synthesis.tts)."""
    model.eval()
    sequence = torch.from_numpy(np.array(_frontend.text_to_sequence(text, p=p))).unsqueeze(0)
    text_positions = torch.arange(1, sequence.size(-1) + 1).unsqueeze(0).long()
    mel_outputs, linear_outputs, alignments, done = model(sequence, text_positions=text_positions,
                                                          speaker_ids=None)
    linear_output = linear_outputs[0].cpu().data.numpy()
    alignment = alignments[0].cpu().data.numpy()
    mel = mel_outputs[0].cpu().data.numpy()
    return linear_output, alignment, linear_output, mel


def eval_model(global_step, writer, model, checkpoint_dir, ismultispeaker):
    texts = [
        "Scientists at the CERN laboratory say they have discovered a new particle.",
        "Generative adversarial network or variational auto-encoder.",
    ]
    speaker_id = 0 if ismultispeaker else None
    for idx, text in enumerate(texts):
        signal, alignment, _, mel = tts(model, text, p=0, speaker_id=speaker_id, fast=False)
        signal /= np.max(np.abs(signal))
        writer.add_scalar(f"(Eval) mel mean text{idx}", mel.mean(), global_step)


def logit(x, eps=1e-8):
    return torch.log(x + eps) - torch.log(1 - x + eps)


def spec_loss(y_hat, y, mask, priority_bin=None, priority_w=0):
    l1 = nn.L1Loss()
    l1_loss = l1(y_hat, y)
    if priority_bin is not None and priority_w > 0:
        priority_loss = l1(y_hat[:, :, :priority_bin], y[:, :, :priority_bin])
        l1_loss = (1 - priority_w) * l1_loss + priority_w * priority_loss
    y_hat_logits = logit(y_hat)
    z = -y * y_hat_logits + torch.log(1 + torch.exp(y_hat_logits))
    binary_div = z.mean()
    return l1_loss, binary_div


def train(model, data_loader, optimizer, writer, init_lr=0.002, checkpoint_dir=None, checkpoint_interval=None,
          nepochs=None, clip_thresh=1.0, train_seq2seq=True, train_postnet=True):
    model.train()
    linear_dim = model.linear_dim
    r = hparams.outputs_per_step
    current_lr = init_lr
    binary_criterion = nn.BCELoss()

    global global_step, global_epoch
    while global_epoch < nepochs:
        running_loss = 0.
        for step, (x, mel, y, done) in enumerate(data_loader):
            ismultispeaker = False
            # Learning rate schedule
            current_lr = noam_learning_rate_decay(init_lr, global_step, **hparams.lr_schedule_kwargs)
            for param_group in optimizer.param_groups:
                param_group['lr'] = current_lr
            optimizer.zero_grad()

            # Apply model
            mel_outputs, linear_outputs, attn, done_hat = model(x, mel)

            # Losses
            w = hparams.binary_divergence_weight
            mel_l1_loss, mel_binary_div = spec_loss(mel_outputs[:, :-r, :], mel[:, r:, :], None)
            mel_loss = (1 - w) * mel_l1_loss + w * mel_binary_div
            done_loss = binary_criterion(done_hat, done)
            n_priority_freq = int(0.5 * linear_dim)
            linear_l1_loss, linear_binary_div = spec_loss(linear_outputs[:, :-r, :], y[:, r:, :], None,
                                                          priority_bin=n_priority_freq,
                                                          priority_w=hparams.priority_freq_weight)
            linear_loss = (1 - w) * linear_l1_loss + w * linear_binary_div
            loss = mel_loss + linear_loss + done_loss

            if global_step > 0 and global_step % hparams.eval_interval == 0:
                eval_model(global_step, writer, model, checkpoint_dir, ismultispeaker)  # BUG

            # Update
            loss.backward()
            if clip_thresh > 0:
                grad_norm = torch.nn.utils.clip_grad_norm_(model.get_trainable_parameters(), clip_thresh)
            optimizer.step()

            # Logs
            writer.add_scalar("loss", float(loss.data), global_step)
            writer.add_scalar("done_loss", float(done_loss.data), global_step)
            writer.add_scalar("mel loss", float(mel_loss.data), global_step)
            writer.add_scalar("linear_loss", float(linear_loss.data), global_step)
            if clip_thresh > 0:
                writer.add_scalar("gradient norm", grad_norm, global_step)
            writer.add_scalar("learning rate", current_lr, global_step)

            global_step += 1
            running_loss += loss.data

        averaged_loss = running_loss / (len(data_loader))
        writer.add_scalar("loss (per epoch)", averaged_loss, global_epoch)
        print(f"Loss: {float(averaged_loss)}")
        global_epoch += 1


if __name__ == "__main__":
    g = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(8):
        x = torch.randint(1, 128, (4, 20), generator=g)
        mel = torch.rand(4, 12, 16, generator=g)
        y = torch.rand(4, 12, 24, generator=g)
        done = torch.zeros(4, 12)
        done[:, -2:] = 1.0
        batches.append((x, mel, y, done))
    model = TTSModel()
    optimizer = torch.optim.Adam(model.get_trainable_parameters(), lr=0.002, betas=(0.5, 0.9), eps=1e-6)
    train(model, batches, optimizer, MemoryWriter(), init_lr=0.002, checkpoint_dir=None,
          checkpoint_interval=hparams.checkpoint_interval, nepochs=4)
