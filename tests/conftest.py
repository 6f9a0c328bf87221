"""Suite-wide settings: tiny tensors gain nothing from two threads that spin on each other."""

import torch

torch.set_num_threads(1)
