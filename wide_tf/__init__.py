"""wide_tf: how far can the batch grow, and how do width and depth change that?

Reproduces and extends Chen et al., "The Effect of Network Width on the Performance of Large-batch
Training" (NeurIPS 2018). See README.md, docs/science.md and docs/design.md."""

__version__ = "0.1.0"
