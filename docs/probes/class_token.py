"""What happens when iRPE (or Swin's bias) meets DeiT's class token on the direction task.

Run on trained image runs (``posenc train image/base encoding.name=irpe model.pool=token ...``):

    python docs/probes/class_token.py RUN [RUN ...]

Per run it prints, at initialisation and trained: how much the class token's features (and the
mean of the patches') vary across 256 validation images, the spread of the logits and the
accuracy; per block, the attention the patches put on the class token and the entropy of the
class token's own attention (1 = uniform); and the gradient of one batch at initialisation that
reaches the encoding's tables, the patch embedding and the class token.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from posenc_cli.config import load_recipe
from posenc_cli.data.images import build_image_data
from posenc_cli.models.attention import Attention
from posenc_cli.runs.checkpoint import load_run_weights
from posenc_cli.tasks.image.train import build_image_model


def spread(features: torch.Tensor) -> float:
    """Standard deviation across images over the size of the mean: 0 = the same for all."""
    return float(features.std(0).norm() / features.mean(0).norm())


def attention_stats(model, images) -> list[tuple[float, float, float]]:
    """Per block: patches' mean attention on the class token, uniform's share, the class
    token's attention entropy over uniform's (the encoding's bias included)."""
    stats = []

    def probe(attn, args, kwargs, _out):
        x, pos = args[0], kwargs["positions"]
        q = attn.split_heads(attn.q(x))
        k, _ = (attn.split_heads(t) for t in attn.kv(x).chunk(2, -1))
        q, k = attn.encoding.rotate(q, k, pos, pos)
        logits = q @ k.transpose(-2, -1) * attn.encoding.logit_scale()
        bias = attn.encoding.bias(q, k, pos, pos)
        weights = (logits if bias is None else logits + bias).softmax(-1)  # (B, H, N, N)
        n = weights.shape[-1]
        row = weights[:, :, 0]
        entropy = -(row * row.clamp_min(1e-12).log()).sum(-1).mean() / math.log(n)
        stats.append((float(weights[:, :, 1:, 0].mean()), 1 / n, float(entropy)))

    hooks = [
        m.register_forward_hook(probe, with_kwargs=True)
        for m in model.modules()
        if isinstance(m, Attention)
    ]
    with torch.no_grad():
        model(images)
    for h in hooks:
        h.remove()
    return stats


def init_gradients(recipe, data, images, labels) -> dict[str, float]:
    torch.manual_seed(recipe.seed)
    model = build_image_model(recipe, data.num_classes, data.channels, data.image_size)
    F.cross_entropy(model(images), labels).backward()

    def norm(pick) -> float:
        grads = [p.grad for n, p in model.named_parameters() if pick(n) and p.grad is not None]
        return float(sum(g.norm() ** 2 for g in grads) ** 0.5)

    return {
        "tables": norm(lambda n: "tables" in n or "bias_table" in n),
        "patch_embed": norm(lambda n: "patch_embed" in n),
        "cls_token": norm(lambda n: n == "cls_token"),
    }


def main(runs: list[Path]) -> None:
    torch.set_num_threads(1)
    for run in runs:
        recipe = load_recipe(run / "recipe.yaml")
        data = build_image_data(recipe.data)
        images = torch.stack([data.val[i][0] for i in range(256)])
        labels = torch.tensor([data.val[i][1] for i in range(256)])
        torch.manual_seed(recipe.seed)
        model = build_image_model(recipe, data.num_classes, data.channels, data.image_size)
        for state in ("init", "trained"):
            if state == "trained":
                load_run_weights(run, model)
            model.eval()
            with torch.no_grad():
                tokens = model.forward_features(images)  # (B, 1 + N, D)
                logits = model.forward_head(tokens)
            accuracy = float((logits.argmax(1) == labels).float().mean())
            print(
                f"{run.name} {state}: class-token spread {spread(tokens[:, 0]):.3f}, patch-mean "
                f"spread {spread(tokens[:, 1:].mean(1)):.3f}, logit sd "
                f"{float(logits.std(0).mean()):.4f}, accuracy {accuracy:.3f}"
            )
        for i, (on_cls, uniform, entropy) in enumerate(attention_stats(model, images[:64])):
            print(
                f"  block {i}: patches on the class token {on_cls:.3f} (uniform {uniform:.3f}), "
                f"class token's entropy / uniform {entropy:.3f}"
            )
        grads = init_gradients(recipe, data, images[:128], labels[:128])
        print("  gradient at init: " + ", ".join(f"{k} {v:.1e}" for k, v in grads.items()))


if __name__ == "__main__":
    main([Path(p) for p in sys.argv[1:]])
