"""RNN encoder-decoder trained without clearing the gradients between batches.

Source: https://github.com/d2l-ai/d2l-en/commit/1dcb528bd4e510c6c46c73cc21ee5041a22bdc63
("[PyTorch] Bug fix zero out grad", merged as #1689), read at its parent 1dcb528b^
(d2l/torch.py: train_seq2seq, grad_clipping, Encoder/Decoder/EncoderDecoder, Seq2SeqEncoder,
sequence_mask, MaskedSoftmaxCELoss; chapter_recurrent-modern/seq2seq.md: Seq2SeqDecoder and the
hyper-parameters embed 32, hidden 32, 2 layers, dropout 0.1, batch 64, 10 steps, lr 0.005).

Theirs: the model classes, the masked loss, grad_clipping and train_seq2seq as in the book at that
commit. Ours: random token batches instead of load_data_nmt (vocabularies of 40 tokens, index 1
is '<bos>'), 4 epochs of 6 batches (theirs: 300 epochs), no Animator/Timer, CPU, `l` renamed
`loss_value` and `type(m) ==` written `is`, `super(Cls, self)` written `super()` (lint).

The bug: the batch loop never calls optimizer.zero_grad(), so every backward adds onto the
gradients of all earlier batches and Adam steps on the running sum. The fix adds
optimizer.zero_grad() at the top of the loop.
"""
import torch
from torch import nn


def grad_clipping(net, theta):
    """Clip the gradient."""
    if isinstance(net, nn.Module):
        params = [p for p in net.parameters() if p.requires_grad]
    else:
        params = net.params
    norm = torch.sqrt(sum(torch.sum(p.grad**2) for p in params))
    if norm > theta:
        for param in params:
            param.grad[:] *= theta / norm


class Encoder(nn.Module):
    """The base encoder interface for the encoder-decoder architecture."""
    def __init__(self, **kwargs):
        super().__init__(**kwargs)

    def forward(self, X, *args):
        raise NotImplementedError


class Decoder(nn.Module):
    """The base decoder interface for the encoder-decoder architecture."""
    def __init__(self, **kwargs):
        super().__init__(**kwargs)

    def init_state(self, enc_outputs, *args):
        raise NotImplementedError

    def forward(self, X, state):
        raise NotImplementedError


class EncoderDecoder(nn.Module):
    """The base class for the encoder-decoder architecture."""
    def __init__(self, encoder, decoder, **kwargs):
        super().__init__(**kwargs)
        self.encoder = encoder
        self.decoder = decoder

    def forward(self, enc_X, dec_X, *args):
        enc_outputs = self.encoder(enc_X, *args)
        dec_state = self.decoder.init_state(enc_outputs, *args)
        return self.decoder(dec_X, dec_state)


class Seq2SeqEncoder(Encoder):
    """The RNN encoder for sequence to sequence learning."""
    def __init__(self, vocab_size, embed_size, num_hiddens, num_layers,
                 dropout=0, **kwargs):
        super().__init__(**kwargs)
        # Embedding layer
        self.embedding = nn.Embedding(vocab_size, embed_size)
        self.rnn = nn.GRU(embed_size, num_hiddens, num_layers,
                          dropout=dropout)

    def forward(self, X, *args):
        # The output `X` shape: (`batch_size`, `num_steps`, `embed_size`)
        X = self.embedding(X)
        # In RNN models, the first axis corresponds to time steps
        X = X.permute(1, 0, 2)
        # When state is not mentioned, it defaults to zeros
        output, state = self.rnn(X)
        return output, state


class Seq2SeqDecoder(Decoder):
    """The RNN decoder for sequence to sequence learning."""
    def __init__(self, vocab_size, embed_size, num_hiddens, num_layers,
                 dropout=0, **kwargs):
        super().__init__(**kwargs)
        self.embedding = nn.Embedding(vocab_size, embed_size)
        self.rnn = nn.GRU(embed_size + num_hiddens, num_hiddens, num_layers,
                          dropout=dropout)
        self.dense = nn.Linear(num_hiddens, vocab_size)

    def init_state(self, enc_outputs, *args):
        return enc_outputs[1]

    def forward(self, X, state):
        # The output `X` shape: (`num_steps`, `batch_size`, `embed_size`)
        X = self.embedding(X).permute(1, 0, 2)
        # Broadcast `context` so it has the same `num_steps` as `X`
        context = state[-1].repeat(X.shape[0], 1, 1)
        X_and_context = torch.cat((X, context), 2)
        output, state = self.rnn(X_and_context, state)
        output = self.dense(output).permute(1, 0, 2)
        return output, state


def sequence_mask(X, valid_len, value=0):
    """Mask irrelevant entries in sequences."""
    maxlen = X.size(1)
    mask = torch.arange((maxlen), dtype=torch.float32,
                        device=X.device)[None, :] < valid_len[:, None]
    X[~mask] = value
    return X


class MaskedSoftmaxCELoss(nn.CrossEntropyLoss):
    """The softmax cross-entropy loss with masks."""

    # `pred` shape: (`batch_size`, `num_steps`, `vocab_size`)
    # `label` shape: (`batch_size`, `num_steps`)
    # `valid_len` shape: (`batch_size`,)
    def forward(self, pred, label, valid_len):
        weights = torch.ones_like(label)
        weights = sequence_mask(weights, valid_len)
        self.reduction = 'none'
        unweighted_loss = super().forward(pred.permute(0, 2, 1), label)
        weighted_loss = (unweighted_loss * weights).mean(dim=1)
        return weighted_loss


def train_seq2seq(net, data_iter, lr, num_epochs, tgt_vocab, device):
    """Train a model for sequence to sequence."""
    def xavier_init_weights(m):
        if type(m) is nn.Linear:
            nn.init.xavier_uniform_(m.weight)
        if type(m) is nn.GRU:
            for param in m._flat_weights_names:
                if "weight" in param:
                    nn.init.xavier_uniform_(m._parameters[param])

    net.apply(xavier_init_weights)
    net.to(device)
    optimizer = torch.optim.Adam(net.parameters(), lr=lr)
    loss = MaskedSoftmaxCELoss()
    net.train()
    for epoch in range(num_epochs):
        metric = [0.0, 0.0]  # Sum of training loss, no. of tokens
        for batch in data_iter:
            X, X_valid_len, Y, Y_valid_len = [x.to(device) for x in batch]
            bos = torch.tensor([tgt_vocab['<bos>']] * Y.shape[0],
                               device=device).reshape(-1, 1)
            dec_input = torch.cat([bos, Y[:, :-1]], 1)  # Teacher forcing
            Y_hat, _ = net(X, dec_input, X_valid_len)
            loss_value = loss(Y_hat, Y, Y_valid_len)
            loss_value.sum().backward()  # BUG
            grad_clipping(net, 1)
            num_tokens = Y_valid_len.sum()
            optimizer.step()
            with torch.no_grad():
                metric[0] += float(loss_value.sum())
                metric[1] += float(num_tokens)
        print(f'epoch {epoch + 1}: loss {metric[0] / metric[1]:.3f}')


if __name__ == "__main__":
    torch.manual_seed(0)
    embed_size, num_hiddens, num_layers, dropout = 32, 32, 2, 0.1
    batch_size, num_steps = 64, 10
    lr, num_epochs, device = 0.005, 4, torch.device('cpu')
    # Random token batches stand in for the English-French NMT data set.
    vocab_size = 40
    tgt_vocab = {'<pad>': 0, '<bos>': 1, '<eos>': 2}
    n = 6 * batch_size
    src = torch.randint(3, vocab_size, (n, num_steps))
    tgt = torch.randint(3, vocab_size, (n, num_steps))
    src_len = torch.randint(3, num_steps + 1, (n,))
    tgt_len = torch.randint(3, num_steps + 1, (n,))
    train_iter = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(src, src_len, tgt, tgt_len), batch_size=batch_size, shuffle=True)
    encoder = Seq2SeqEncoder(vocab_size, embed_size, num_hiddens, num_layers, dropout)
    decoder = Seq2SeqDecoder(vocab_size, embed_size, num_hiddens, num_layers, dropout)
    net = EncoderDecoder(encoder, decoder)
    train_seq2seq(net, train_iter, lr, num_epochs, tgt_vocab, device)
