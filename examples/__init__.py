"""Examples of using wide_tf from outside the package (docs/options.md#your-own-model)."""
