"""`torchdoctor fit`: the peak memory of one training step of the user's own script on a
GPU it has never seen, estimated on the CPU under fake tensors."""
