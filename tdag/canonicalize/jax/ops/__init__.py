"""The table from JAX primitives to tdag, a family a file."""
