"""wide_tf: how far can the batch grow, and how do width and depth change that? (Chen et al., NeurIPS 2018)."""

__version__ = "0.1.0"
