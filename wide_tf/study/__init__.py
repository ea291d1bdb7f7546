"""A study: its trials, the learning-rate protocol of each cell, and the workers that run them."""
