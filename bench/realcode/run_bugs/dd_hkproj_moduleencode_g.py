# Source: https://github.com/hkproj/pytorch-transformer-distributed/pull/3
# Original: hkproj/pytorch-transformer-distributed train.py (train_model) and model.py (Transformer.encode/decode/
# project), at 8eeb15b^
# Bug: the model is wrapped in DistributedDataParallel, but every training step runs model.module.encode, .decode and
# .project; DDP's forward never runs, its reducer is never prepared, loss.backward() all-reduces nothing and each rank
# trains its own copy on its shard (fix: a Transformer.forward called through the wrapper).
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

VOCAB, SEQ, D_MODEL, PAD, SOS = 24, 10, 32, 0, 1


class Transformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.src_embed = nn.Embedding(VOCAB, D_MODEL)
        self.tgt_embed = nn.Embedding(VOCAB, D_MODEL)
        self.pos = nn.Parameter(torch.randn(SEQ, D_MODEL) * 0.02)
        self.encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(D_MODEL, 4, 64, 0.1, batch_first=True), 1)
        self.decoder = nn.TransformerDecoder(nn.TransformerDecoderLayer(D_MODEL, 4, 64, 0.1, batch_first=True), 1)
        self.projection_layer = nn.Linear(D_MODEL, VOCAB)

    def encode(self, src, src_mask):
        return self.encoder(self.src_embed(src) + self.pos, src_key_padding_mask=src_mask)

    def decode(self, encoder_output, src_mask, tgt, tgt_mask):
        return self.decoder(self.tgt_embed(tgt) + self.pos, encoder_output, tgt_mask=tgt_mask,
                            memory_key_padding_mask=src_mask)

    def project(self, x):
        return self.projection_layer(x)


def reversal_dataset(n):
    """Translate a sequence into its reverse: label[i] = src[len-1-i], the decoder input shifted by [SOS]."""
    g = torch.Generator().manual_seed(0)
    src = torch.randint(2, VOCAB, (n, SEQ), generator=g)
    label = src.flip(1)
    decoder_input = torch.cat([torch.full((n, 1), SOS), label[:, :-1]], 1)
    return TensorDataset(src, decoder_input, label)


def train_model():
    local_rank, global_rank = int(os.environ["LOCAL_RANK"]), int(os.environ["RANK"])
    torch.manual_seed(0)
    dataset = reversal_dataset(512)
    train_dataloader = DataLoader(dataset, batch_size=16, shuffle=False, sampler=DistributedSampler(dataset,
                                                                                                     shuffle=True))
    model = Transformer()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-9)
    model = DistributedDataParallel(model)
    loss_fn = nn.CrossEntropyLoss(ignore_index=PAD, label_smoothing=0.1)
    decoder_mask = nn.Transformer.generate_square_subsequent_mask(SEQ)
    global_step = 0
    for epoch in range(3):
        model.train()
        train_dataloader.sampler.set_epoch(epoch)
        for encoder_input, decoder_input, label in train_dataloader:
            encoder_mask = encoder_input == PAD
            # Run the tensors through the encoder, decoder and the projection layer
            encoder_output = model.module.encode(encoder_input, encoder_mask)  # BUG
            decoder_output = model.module.decode(encoder_output, encoder_mask, decoder_input, decoder_mask)
            proj_output = model.module.project(decoder_output)
            loss = loss_fn(proj_output.view(-1, VOCAB), label.view(-1))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            global_step += 1
        print(f"[rank {global_rank}] epoch {epoch} loss {loss.item():6.3f} global_step {global_step}")


dist.init_process_group("gloo")
train_model()
dist.barrier()
dist.destroy_process_group()
