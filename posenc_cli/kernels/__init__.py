"""The bottom layer: attention kernels on plain tensors, each with its own backward where
autograd would hold an (N, N) tensor too many. They import torch and each other, nothing of
posenc above them, so encodings and the attention module can both call them.

- ``biased_sdpa``: flash attention plus an additive bias, with one chunked backward.
- ``clipped_attention``: Shaw's and T5's clipped relative terms, near band explicit, far keys
  through the flash kernel, merged by logsumexp.
- ``bucket_attention``: iRPE's contextual terms, an explicit softmax with a hand-written backward.
- ``buckets``: per-bucket gathers and sums the kernels and the encodings share.
- ``positions``: whether positions are consecutive, or dense enough for a table of distances.
"""
