"""The theory check at initialisation: gradient diversity across the members of a family."""
