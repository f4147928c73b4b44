"""tdag.to_jax: a Program as a jittable JAX function, its weights a pytree."""
