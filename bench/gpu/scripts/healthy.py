"""A healthy bf16 GPT-style run on the GPU: nothing should be reported."""
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
vocab, dim, block = 8192, 512, 256
layer = nn.TransformerEncoderLayer(dim, 8, 4 * dim, dropout=0.0, batch_first=True, norm_first=True)
model = nn.ModuleDict({"embed": nn.Embedding(vocab, dim),
                       "body": nn.TransformerEncoder(layer, 6, enable_nested_tensor=False),
                       "head": nn.Linear(dim, vocab)}).cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
mask = nn.Transformer.generate_square_subsequent_mask(block, device="cuda")
data = torch.randint(0, vocab, (64 * 32, block + 1))
for step in range(150):
    batch = data[(step % 64) * 32:(step % 64 + 1) * 32].cuda(non_blocking=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        h = model["body"](model["embed"](batch[:, :-1]), mask=mask, is_causal=True)
        loss = F.cross_entropy(model["head"](h).flatten(0, 1), batch[:, 1:].flatten())
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if step % 50 == 0:
        print(step, loss.item())
